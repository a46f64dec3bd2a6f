"""scripts/test_places.py: each test runs in exactly one place, and the tests no tox env runs run in make test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from scripts.test_places import Place, places, selects

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

TOX = """
[tox]
env_list = a, b
[testenv]
commands = pytest -q {posargs}
[testenv:a]
commands = pytest -q tests/a {posargs}
[testenv:b]
commands = pytest -q tests/b --ignore=tests/b/test_external.py \\
    {posargs}
[testenv:b-external]
commands = pytest -q {toxinidir}/tests/b/test_external.py {posargs}
"""


def suite(root: Path, tox: str = TOX) -> Path:
    (root / "tox.ini").write_text(tox, encoding="utf-8")
    files = {"tests/a/test_one.py": "def test_one():\n    pass\n",
             "tests/b/test_two.py": "def test_two():\n    pass\n",
             "tests/b/test_external.py": "import pytest\npytest.importorskip('no_such_library')\n",
             "tests/c/test_three.py": "def test_three():\n    pass\n\ndef test_four():\n    pass\n",
             "tests/c/test_soak.py": "import pytest\n\n@pytest.mark.soak\ndef test_soak():\n    pass\n"}
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text, encoding="utf-8")
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["soak: long"]\n', encoding="utf-8")
    return root


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import test_places; "
            "raise SystemExit(test_places.main(sys.argv[3:], root=Path(sys.argv[2])))")
    return subprocess.run([sys.executable, "-c", code, str(SCRIPTS), str(root), *args], cwd=root,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_arguments_of_a_place() -> None:
    place = Place.from_args("tox -e x", ["-q", "tests/b", "--ignore=tests/b/test_external.py", "--deselect",
                                         "tests/b/test_two.py::test_two", "-m", "not slow", "--tb=short"])
    assert (place.paths, place.ignore, place.deselect, place.marker, place.problems) == (
        ["tests/b"], ["tests/b/test_external.py"], ["tests/b/test_two.py::test_two"], "not slow", [])
    assert selects(place, "tests/b/test_two.py::test_other[1]", set())
    assert not selects(place, "tests/b/test_two.py::test_two", set())
    assert not selects(place, "tests/b/test_external.py", set())
    assert not selects(place, "tests/bb/test_two.py::test_two", set())
    assert not selects(place, "tests/b/test_two.py::test_other", {"slow"})
    assert Place.from_args("tox -e y", ["-k", "fast"]).problems  # -k: the check cannot tell what runs


def test_the_repository_places_every_test_once() -> None:
    """The places of this repository's tox.ini: every env that runs pytest, and make soak."""
    names = [p.name for p in places()]
    assert "tox -e core" in names and "make soak" in names and len(names) == len(set(names))


def test_the_rest_runs_here_and_the_rest_only(tmp_path: Path) -> None:
    done = run(suite(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("test places: tox -e a 1, tox -e b 1, tox -e b-external 1, make soak 1; here (no tox env runs them): "
            "2 (tests/c/test_three.py)") in done.stdout
    assert "2 passed, 1 skipped, 3 deselected" in done.stdout  # the skip: a module placed elsewhere, skipped at import


def test_nothing_left_here_is_no_failure(tmp_path: Path) -> None:
    done = run(suite(tmp_path, TOX + "[testenv:c]\ncommands = pytest tests/c -m 'not soak'\n"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "here (no tox env runs them): 0" in done.stdout


@pytest.mark.parametrize(("extra", "message"), [
    ("[testenv:twice]\ncommands = pytest tests/a/test_one.py::test_one\n",
     "tests/a/test_one.py::test_one runs in 2 places: tox -e a, tox -e twice"),
    ("[testenv:gone]\ncommands = pytest tests/d\n", "tox -e gone runs no test of the suite: tests/d not found"),
    ("[testenv:k]\ncommands = pytest -k one tests/c\n", "tox -e k: pytest option '-k' may change which tests run"),
])
def test_a_test_run_twice_or_a_stale_place_fails(tmp_path: Path, extra: str, message: str) -> None:
    done = run(suite(tmp_path, TOX + extra), "--list")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert message in done.stderr


def test_a_soak_test_in_a_tox_env_is_run_twice(tmp_path: Path) -> None:
    done = run(suite(tmp_path, TOX + "[testenv:c]\ncommands = pytest tests/c\n"), "--list")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "tests/c/test_soak.py::test_soak runs in 2 places: tox -e c, make soak" in textwrap.dedent(done.stderr)
