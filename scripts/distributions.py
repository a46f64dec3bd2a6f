"""The distributions this repository ships, and what each one's metadata and built wheel must hold.

The shipped distributions are ``loader-core`` (the root ``pyproject.toml``) and one
``loader-plugin-<name>`` per ``plugins/<name>/pyproject.toml`` whose folder name does not start
with ``_`` (``plugins/_template`` is a skeleton to copy, not a plugin we publish).

What a user installs from PyPI is the wheel, not this checkout, so each promise is checked where
it lands: :func:`declaration_problems` reads the declared metadata (from a ``pyproject.toml`` or
from a wheel's ``METADATA``) — the Apache-2.0 license and its file, classifiers, project URLs,
version bounds on every first-party requirement that include the version this checkout builds, a
README (the PyPI page) that starts with the install line; :func:`wheel_problems` adds what only
a built wheel shows — every file of the package's source folder inside it, and the license file.

Runs with the standard library plus ``packaging`` (which hatchling, the build backend, brings).
"""

from __future__ import annotations

import email.parser
import re
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

__all__ = [
    "LICENSE_EXPRESSION",
    "REQUIRED_URLS",
    "ROOT",
    "Declared",
    "Distribution",
    "declaration_problems",
    "declared_in_wheel",
    "find_wheel",
    "first_party_requirements",
    "shipped_distributions",
    "wheel_problems",
]

ROOT = Path(__file__).resolve().parent.parent
LICENSE_EXPRESSION = "Apache-2.0"
REQUIRED_URLS = ("Homepage", "Source", "Issues")
FIRST_PARTY = re.compile(r"^loader-(core|plugin-[a-z0-9_-]+)$")


@dataclass(frozen=True)
class Distribution:
    """One shipped distribution: its name and version, its folder and the source folders its wheel carries."""

    name: str
    version: str
    project_dir: Path
    package_dirs: tuple[Path, ...]

    @property
    def wheel_stem(self) -> str:
        """The wheel file name's first part (``loader_plugin_gguf-0.1.0``), as PEP 427 normalizes it."""
        return f"{re.sub(r'[-_.]+', '_', self.name).lower()}-{self.version}"


@dataclass(frozen=True)
class Declared:
    """What a distribution's metadata declares, read from ``pyproject.toml`` or from a wheel's ``METADATA``."""

    name: str
    license_expression: str | None
    license_files: tuple[str, ...]
    classifiers: tuple[str, ...]
    urls: dict[str, str]
    requirements: tuple[str, ...]  # unconditional ones only (no extras, no markers)
    readme: str

    @classmethod
    def from_pyproject(cls, project_dir: Path) -> Declared:
        project = tomllib.loads((project_dir / "pyproject.toml").read_text())["project"]
        readme = project.get("readme")
        return cls(name=project["name"], license_expression=project.get("license"),
                   license_files=tuple(project.get("license-files", ())),
                   classifiers=tuple(project.get("classifiers", ())), urls=dict(project.get("urls", {})),
                   requirements=tuple(project.get("dependencies", ())),
                   readme=(project_dir / readme).read_text() if isinstance(readme, str) else "")


def shipped_distributions(root: Path = ROOT) -> list[Distribution]:
    """``loader-core`` first, then each shipped plugin in folder order."""
    plugins = sorted(p.parent for p in root.glob("plugins/*/pyproject.toml")
                     if not p.parent.name.startswith(("_", ".")))
    folders = [root, *plugins]
    found = []
    for folder in folders:
        data = tomllib.loads((folder / "pyproject.toml").read_text())
        packages = data["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
        found.append(Distribution(name=data["project"]["name"], version=data["project"]["version"],
                                  project_dir=folder, package_dirs=tuple(folder / p for p in packages)))
    return found


def first_party_requirements(requirements: tuple[str, ...] | list[str]) -> list[Requirement]:
    """The requirements on our own distributions (``loader-core``, ``loader-plugin-*``)."""
    parsed = [Requirement(r) for r in requirements]
    return [r for r in parsed if FIRST_PARTY.match(canonicalize_name(r.name))]


def _bounds_problem(requirement: Requirement, versions: dict[str, str]) -> str | None:
    specifier = requirement.specifier
    operators = {spec.operator for spec in specifier}
    if not operators & {">=", ">", "==", "~=", "==="} or not operators & {"<", "<=", "==", "~=", "==="}:
        return f"requires {requirement} without a lower and an upper version bound"
    ours = versions.get(canonicalize_name(requirement.name))
    if ours is not None and not SpecifierSet(str(specifier)).contains(ours, prereleases=True):
        return f"requires {requirement}, which excludes {requirement.name} {ours} that this checkout builds"
    return None


def declaration_problems(declared: Declared, versions: dict[str, str]) -> list[str]:
    """Everything ``declared`` is missing; ``versions`` maps each shipped distribution to its version."""
    problems = []
    if declared.license_expression != LICENSE_EXPRESSION:
        problems.append(f"license is {declared.license_expression!r}, not {LICENSE_EXPRESSION!r}")
    if "LICENSE" not in declared.license_files:
        problems.append("no LICENSE among its license files")
    if not declared.classifiers:
        problems.append("no classifiers")
    missing_urls = [key for key in REQUIRED_URLS if key not in declared.urls]
    if missing_urls:
        problems.append(f"no project URL {', '.join(missing_urls)}")
    first_party = first_party_requirements(declared.requirements)
    for requirement in first_party:
        problem = _bounds_problem(requirement, versions)
        if problem:
            problems.append(problem)
    if declared.name != "loader-core":
        if "loader-core" not in {canonicalize_name(r.name) for r in first_party}:
            problems.append("does not require loader-core")
        install_line = f"`pip install {declared.name}`"
        first_text = next((line for line in declared.readme.splitlines()
                           if line.strip() and not line.startswith("#")), "")
        if not first_text.startswith(install_line):
            problems.append(f"README (its PyPI page) does not start with the install line {install_line}")
    return [f"{declared.name}: {p}" for p in problems]


def find_wheel(folder: Path, distribution: Distribution) -> Path:
    """The one wheel of ``distribution`` in ``folder``; a missing or ambiguous one is an error."""
    found = sorted(folder.glob(f"{distribution.wheel_stem}-*.whl"))
    if len(found) != 1:
        raise FileNotFoundError(f"{folder}: expected one wheel of {distribution.name} {distribution.version} "
                                f"({distribution.wheel_stem}-*.whl), found {len(found)}")
    return found[0]


def _dist_info(names: list[str]) -> str:
    return next(n.split("/", 1)[0] for n in names if n.endswith(".dist-info/METADATA"))


def declared_in_wheel(wheel: Path) -> Declared:
    """What a built wheel's ``METADATA`` declares (as PyPI and pip will read it)."""
    with zipfile.ZipFile(wheel) as archive:
        info = _dist_info(archive.namelist())
        message = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode("utf-8"))
    urls: dict[str, str] = {}
    for value in message.get_all("Project-URL", []):
        label, _, url = value.partition(",")
        urls[label.strip()] = url.strip()
    requirements = tuple(r for r in message.get_all("Requires-Dist", []) if ";" not in r)
    return Declared(name=message["Name"], license_expression=message["License-Expression"],
                    license_files=tuple(message.get_all("License-File", [])),
                    classifiers=tuple(message.get_all("Classifier", [])), urls=urls, requirements=requirements,
                    readme=str(message.get_payload()))


def _source_files(package_dir: Path) -> list[str]:
    """Every file a wheel must carry from ``package_dir``, as wheel member names (``loader/py.typed``)."""
    return sorted(f"{package_dir.name}/{path.relative_to(package_dir).as_posix()}"
                  for path in package_dir.rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc")


def wheel_problems(wheel: Path, distribution: Distribution, versions: dict[str, str],
                   license_text: bytes) -> list[str]:
    """What ``wheel`` lacks: its metadata's promises, any source file, or the license text itself."""
    problems = declaration_problems(declared_in_wheel(wheel), versions)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        members = set(names)
        info = _dist_info(names)
        license_member = f"{info}/licenses/LICENSE"
        if license_member not in members:
            problems.append(f"{distribution.name}: {wheel.name} has no {license_member}")
        elif archive.read(license_member) != license_text:
            problems.append(f"{distribution.name}: {wheel.name}'s LICENSE differs from the repository's")
    for package_dir in distribution.package_dirs:
        missing = [name for name in _source_files(package_dir) if name not in members]
        if missing:
            problems.append(f"{distribution.name}: {wheel.name} lacks {len(missing)} file(s) of "
                            f"{package_dir.relative_to(distribution.project_dir)}: {', '.join(missing[:5])}")
    return problems
