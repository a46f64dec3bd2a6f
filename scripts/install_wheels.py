"""Install some of our built wheels into this Python environment, and none of our others.

A tox env names the plugins its tests need (``gguf llama``); this installs ``loader-core`` and those
plugins from the folder ``scripts/build_wheels.py`` filled, with the first-party distributions they
require (read from each wheel's ``Requires-Dist``). Every one of ours already in the env is removed
first: a plugin a previous run installed must not linger, and a rebuilt wheel keeps its version, so
pip would keep the old files. A test then sees exactly what ``pip install`` of those wheels gives a
user. Our own distributions are always given as wheel files, never looked up on an index (a
same-named project there must not win); their third-party requirements come from the index,
through ``constraints.txt``.

    python scripts/install_wheels.py --wheels DIR [--constraint FILE] NAME...    # NAME: gguf, runai[test], ...
    python scripts/install_wheels.py --wheels DIR --all                          # every wheel in DIR

Standard library only: it runs in each test env before anything else is installed there.
"""

from __future__ import annotations

import argparse
import email.message
import email.parser
import importlib.metadata
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OURS = re.compile(r"^loader-(core|plugin-.+)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distribution_name(argument: str) -> tuple[str, str]:
    """``core`` -> ``loader-core``, ``gguf`` -> ``loader-plugin-gguf`` (a full name stays), and any ``[extras]``."""
    bare, bracket, extras = argument.partition("[")
    name = canonical(bare)
    if not OURS.match(name):
        name = "loader-core" if name == "core" else f"loader-plugin-{name}"
    return name, bracket + extras


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        return email.parser.Parser().parsestr(archive.read(member).decode("utf-8"))


def wheels_by_name(folder: Path) -> dict[str, Path]:
    """Each wheel in ``folder`` under its distribution's canonical name."""
    return {canonical(_metadata(wheel)["Name"]): wheel for wheel in sorted(folder.glob("*.whl"))}


def _requirement_name(requirement: str) -> str:
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    return canonical(match.group(1)) if match else ""


def with_requirements(names: list[str], wheels: dict[str, Path]) -> list[str]:
    """``names`` and every first-party distribution they require (unconditionally), ``loader-core`` first."""
    wanted = ["loader-core", *names]
    index = 0
    while index < len(wanted):
        name = wanted[index]
        if name not in wheels:
            raise SystemExit(f"error: no wheel of {name} among {', '.join(sorted(wheels)) or 'none'}")
        for requirement in _metadata(wheels[name]).get_all("Requires-Dist", []):
            required = _requirement_name(requirement)
            if ";" not in requirement and OURS.match(required) and required not in wanted:
                wanted.append(required)
        index += 1
    return list(dict.fromkeys(wanted))


def _pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--wheels", type=Path, required=True, help="the folder scripts/build_wheels.py filled")
    parser.add_argument("--constraint", type=Path, default=ROOT / "constraints.txt", help="pip constraints file")
    parser.add_argument("--all", action="store_true", help="install every wheel in the folder (every plugin)")
    parser.add_argument("names", nargs="*", help="plugins to install (core is always installed)")
    args = parser.parse_args()

    wheels = wheels_by_name(args.wheels)
    if args.all:
        args.names = [*args.names, *(n for n in wheels if n != "loader-core")]
    extras = dict(distribution_name(n) for n in args.names)  # safetensors[test] -> its wheel with extra "test"
    wanted = with_requirements(list(extras), wheels)
    installed = {canonical(d.metadata["Name"] or "") for d in importlib.metadata.distributions()}
    # all of ours go first, wanted or not: a rebuilt wheel keeps its version, and pip would keep the old files
    leftovers = sorted(n for n in installed if OURS.match(n))
    if leftovers:
        _pip("uninstall", "--quiet", "--yes", *leftovers)
    _pip("install", "--quiet", "--constraint", str(args.constraint),
         *(f"{wheels[n]}{extras.get(n, '')}" for n in wanted))
    print(f"installed from wheels: {', '.join(wanted)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
