"""Every test runs in exactly one place: a tox env (from the wheels), ``make soak``, or here, in ``.venv``.

A place is a ``[testenv:NAME]`` of ``tox.ini`` with its pytest arguments (paths, ``--ignore``,
``--deselect``, ``-m``), or ``make soak`` (the tests marked ``soak``). This collects the whole suite once,
in this environment (every distribution installed, so every module imports), and gives each test to the
places whose arguments select it: a test selected by two places fails the run (it would run twice), and so
does a place that selects nothing (a stale path). Tests no place selects are the rest, and run here: a new
test folder is never left out, it runs here until a tox env names it.

    python scripts/test_places.py [PYTEST_ARGS...]   # check, then run the rest (make rest, in make test)
    python scripts/test_places.py --list             # check, print each place and the rest, run nothing

A test file outside ``tests/`` (``plugins/_template/tests``) is not part of the suite; a place running one
only has to name a path that exists. Pytest's exit status 5 (no test left to run here) counts as success.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from _pytest.mark.expression import Expression

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tox_envs import ROOT, read_envs

__all__ = ["Place", "Placement", "main", "places", "selects"]

SOAK = "make soak"
SUITE = "tests"
# options that change nothing about which tests a pytest run selects
NEUTRAL = {"-q", "-v", "-x", "-s", "-ra", "-rs", "-rA", "--strict-markers", "--no-header", "-l"}
NEUTRAL_PREFIXES = ("--tb=", "-r", "--durations", "--junitxml=", "-W", "--maxfail", "-p")


@dataclass
class Place:
    """A place tests run: positional paths or node ids, ``--ignore`` paths, ``--deselect`` ids, a ``-m`` expression."""

    name: str
    paths: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    deselect: list[str] = field(default_factory=list)
    marker: str | None = None
    problems: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, name: str, args: Iterable[str]) -> Place:
        place = cls(name)
        words = list(args)
        index = 0
        while index < len(words):
            word = words[index]
            option, _, inline = word.partition("=")
            if option in ("--ignore", "--deselect", "-m"):
                value = inline if "=" in word else (words[index + 1] if index + 1 < len(words) else "")
                index += 1 if "=" in word else 2
                if option == "--ignore":
                    place.ignore.append(os.path.normpath(value))
                elif option == "--deselect":
                    place.deselect.append(value)
                else:
                    place.marker = value
                continue
            if word.startswith("-"):
                if word not in NEUTRAL and not word.startswith(NEUTRAL_PREFIXES):
                    place.problems.append(f"{name}: pytest option {word!r} may change which tests run, and "
                                          "scripts/test_places.py cannot tell which (use paths, --ignore, "
                                          "--deselect or -m)")
            else:
                path, sep, node = word.partition("::")
                place.paths.append(os.path.normpath(path) + sep + node)
            index += 1
        if not place.paths:
            place.paths.append(SUITE)
        return place


def places(root: Path = ROOT) -> list[Place]:
    """Every tox env that runs pytest (one place per pytest command), then ``make soak``."""
    found = []
    for env in read_envs(root).values():
        for number, args in enumerate(env.pytest_commands):
            name = f"tox -e {env.name}" + (f" (pytest command {number + 1})" if number else "")
            found.append(Place.from_args(name, args))
    found.append(Place(SOAK, paths=[SUITE], marker="soak"))
    return found


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _marker_matches(expression: str, markers: set[str]) -> bool:
    def matcher(name: str, **kwargs: object) -> bool:
        return name in markers

    return Expression.compile(expression).evaluate(matcher)  # type: ignore[arg-type]


def selects(place: Place, nodeid: str, markers: set[str]) -> bool:
    """Whether ``place``'s arguments select the test ``nodeid`` (a module's path when it has no collected test)."""
    path = nodeid.split("::", 1)[0]
    if any(_under(path, ignored) for ignored in place.ignore):
        return False
    if any(nodeid == d or nodeid.startswith((d + "::", d + "[")) for d in place.deselect):
        return False
    if place.marker is not None and not _marker_matches(place.marker, markers):
        return False
    for arg in place.paths:
        if "::" in arg:
            if "::" not in nodeid and arg.split("::", 1)[0] == path:
                return True  # a module with no collected test: the place runs part of it
            if nodeid == arg or nodeid.startswith((arg + "::", arg + "[")):
                return True
        elif _under(path, arg):
            return True
    return False


@dataclass
class Placement:
    """The outcome: which places run each test, and what no place runs."""

    owners: dict[str, list[str]]  # test (or module) -> the places that select it
    counts: dict[str, int]

    def duplicates(self) -> dict[str, list[str]]:
        return {test: names for test, names in self.owners.items() if len(names) > 1}

    def rest(self) -> list[str]:
        return [test for test, names in self.owners.items() if not names]


class Placer:
    """A pytest plugin: places every collected test, fails on a test run twice, leaves only the rest to run."""

    def __init__(self, found: list[Place], root: Path, listing: bool, write: Callable[[str], None]) -> None:
        self.places = found
        self.root = root
        self.listing = listing
        self.write = write
        self.module_units: dict[str, set[str]] = {}  # modules that gave no test here (skipped or empty)
        self.placement: Placement | None = None

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        nodeid = report.nodeid
        if nodeid.endswith(".py") and "::" not in nodeid and (report.skipped or not report.result):
            self.module_units[nodeid] = set()

    def _place(self, units: dict[str, set[str]]) -> Placement:
        owners = {unit: [p.name for p in self.places if selects(p, unit, markers)] for unit, markers in units.items()}
        counts = {p.name: sum(p.name in names for names in owners.values()) for p in self.places}
        return Placement(owners, counts)

    def _problems(self, placement: Placement) -> list[str]:
        problems = [problem for place in self.places for problem in place.problems]
        for unit, names in placement.duplicates().items():
            problems.append(f"{unit} runs in {len(names)} places: {', '.join(names)} (give it to one: an --ignore "
                            "or a narrower path in tox.ini)")
        for place in self.places:
            if placement.counts[place.name] or place.name == SOAK:
                continue
            outside = [p for p in place.paths if not _under(p.split("::", 1)[0], SUITE)]
            missing = [p for p in place.paths if not (self.root / p.split("::", 1)[0]).exists()]
            if missing or not outside:
                problems.append(f"{place.name} runs no test of the suite: "
                                f"{', '.join(missing) + ' not found' if missing else 'its arguments select none'}")
        return problems

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        units = {item.nodeid: {m.name for m in item.iter_markers()} for item in items}
        units.update(self.module_units)
        placement = self.placement = self._place(units)
        problems = self._problems(placement)
        if problems:
            raise pytest.UsageError("scripts/test_places.py: every test must run in exactly one place:\n  "
                                    + "\n  ".join(problems))
        rest = set(placement.rest())
        summary = ", ".join(f"{name} {count}" for name, count in placement.counts.items() if count)
        self.write(f"test places: {summary}; here (no tox env runs them): {len(rest)} "
                   f"({_folders(sorted(rest))})")
        if self.listing:
            for name in placement.counts:
                tests = sorted(t for t, names in placement.owners.items() if name in names)
                self.write(f"{name}: {_folders(tests)}")
        kept = [item for item in items if item.nodeid in rest]
        deselected = [item for item in items if item.nodeid not in rest]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _folders(tests: list[str]) -> str:
    """The files of ``tests``, or their folders where every collected file of a folder is there: a short list."""
    files = sorted({t.split("::", 1)[0] for t in tests})
    return " ".join(files) if len(files) <= 6 else " ".join(sorted({str(Path(f).parent) for f in files}))


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    listing = "--list" in args
    args = [a for a in args if a != "--list"]
    os.chdir(root)
    found = places(root)
    placer = Placer(found, root, listing, write=lambda line: print(line, flush=True))
    pytest_args = ["-p", "no:cacheprovider", *(["--collect-only", "-qq"] if listing else []), *args, SUITE]
    print(f"pytest {shlex.join(pytest_args)}  # with scripts/test_places.py placing each test", flush=True)
    status = pytest.main(pytest_args, plugins=[placer])
    if status == pytest.ExitCode.NO_TESTS_COLLECTED and placer.placement is not None:
        return 0  # every test runs in a tox env or make soak: nothing is left for here
    return int(status)


if __name__ == "__main__":
    raise SystemExit(main())
