"""Every shipped distribution declares what PyPI and pip need, requires what it imports, and its wheel holds it all.

The checks themselves live in ``scripts/distributions.py``: ``scripts/build_wheels.py`` runs them on
every wheel tox builds, and these tests run them on the ``pyproject.toml`` files (no build) and on
wheels built here, with deliberately broken inputs to show each check fails.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from scripts.distributions import (
    ROOT,
    Declared,
    Distribution,
    declaration_problems,
    find_wheel,
    shipped_distributions,
    wheel_problems,
)
from scripts.install_wheels import wheels_by_name, with_requirements

DISTRIBUTIONS = shipped_distributions()
VERSIONS = {d.name: d.version for d in DISTRIBUTIONS}
LICENSE = (ROOT / "LICENSE").read_bytes()
IMPORT = re.compile(r"^\s*(?:from|import)\s+(loader_plugin_[a-z0-9_]+)", re.MULTILINE)


def _by_name(name: str) -> Distribution:
    return next(d for d in DISTRIBUTIONS if d.name == name)


def _requirements(distribution: Distribution) -> list[Requirement]:
    return [Requirement(r) for r in Declared.from_pyproject(distribution.project_dir).requirements]


def test_the_core_and_every_plugin_folder_are_shipped() -> None:
    plugins = sorted(p.name for p in (ROOT / "plugins").iterdir()
                     if (p / "pyproject.toml").is_file() and not p.name.startswith("_"))
    assert [d.name for d in DISTRIBUTIONS] == ["loader-core", *(f"loader-plugin-{p}" for p in plugins)]


def test_a_template_folder_is_not_shipped(tmp_path: Path) -> None:
    for folder, name in ((tmp_path, "loader-core"), (tmp_path / "plugins" / "_template", "loader-plugin-template"),
                         (tmp_path / "plugins" / "toy", "loader-plugin-toy")):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "pyproject.toml").write_text(
            f'[project]\nname = "{name}"\nversion = "1.0"\n[tool.hatch.build.targets.wheel]\npackages = ["src/x"]\n')
    assert [d.name for d in shipped_distributions(tmp_path)] == ["loader-core", "loader-plugin-toy"]


@pytest.mark.parametrize("distribution", DISTRIBUTIONS, ids=lambda d: d.name)
def test_pyproject_declares_license_classifiers_urls_bounds_and_install_line(distribution: Distribution) -> None:
    assert declaration_problems(Declared.from_pyproject(distribution.project_dir), VERSIONS) == []
    assert (distribution.project_dir / "LICENSE").read_bytes() == LICENSE


@pytest.mark.parametrize("distribution", [d for d in DISTRIBUTIONS if d.name != "loader-core"], ids=lambda d: d.name)
def test_plugin_requires_every_first_party_package_it_imports(distribution: Distribution) -> None:
    """A plugin that imports another plugin must require it, or it breaks when installed alone."""
    own = {package.name for package in distribution.package_dirs}
    imported = {match for package in distribution.package_dirs for path in package.rglob("*.py")
                for match in IMPORT.findall(path.read_text())} - own
    required = {r.name.replace("-", "_") for r in _requirements(distribution)}
    assert imported <= required


def test_gguf_requires_llama_but_not_qwen() -> None:
    names = {r.name for r in _requirements(_by_name("loader-plugin-gguf"))}
    assert "loader-plugin-llama" in names
    assert "loader-plugin-qwen" not in names


def test_declaration_problems_name_what_is_missing() -> None:
    bare = Declared(name="loader-plugin-toy", license_expression="MIT", license_files=(), classifiers=(),
                    urls={"Homepage": "https://example.org"},
                    requirements=("loader-core", "loader-plugin-llama>=0.2", "torch>=2.4"),
                    readme="# loader-plugin-toy\n\nA toy.\n")
    assert declaration_problems(bare, {"loader-core": "0.1.0", "loader-plugin-llama": "0.1.0"}) == [
        "loader-plugin-toy: license is 'MIT', not 'Apache-2.0'",
        "loader-plugin-toy: no LICENSE among its license files",
        "loader-plugin-toy: no classifiers",
        "loader-plugin-toy: no project URL Source, Issues",
        "loader-plugin-toy: requires loader-core without a lower and an upper version bound",
        "loader-plugin-toy: requires loader-plugin-llama>=0.2 without a lower and an upper version bound",
        "loader-plugin-toy: README (its PyPI page) does not start with the install line "
        "`pip install loader-plugin-toy`",
    ]


def test_a_bound_that_excludes_this_checkouts_version_is_a_problem() -> None:
    declared = Declared.from_pyproject(_by_name("loader-plugin-llama").project_dir)
    assert declaration_problems(declared, {**VERSIONS, "loader-core": "0.2.0"}) == [
        "loader-plugin-llama: requires loader-core<0.2,>=0.1.0, which excludes loader-core 0.2.0 that this "
        "checkout builds"]


# --- built wheels --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Wheels of loader-core, -llama and -gguf, built as scripts/build_wheels.py builds them (hatchling from here)."""
    pytest.importorskip("hatchling", reason="builds wheels without isolation: needs hatchling (requirements-test)")
    out = tmp_path_factory.mktemp("wheels")
    names = ("loader-core", "loader-plugin-llama", "loader-plugin-gguf")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "--wheel-dir", str(out),
                    *(str(_by_name(n).project_dir) for n in names)], check=True, capture_output=True, timeout=300)
    return out


@pytest.mark.parametrize("name", ["loader-core", "loader-plugin-llama", "loader-plugin-gguf"])
def test_built_wheel_holds_its_metadata_every_source_file_and_the_license(wheels: Path, name: str) -> None:
    distribution = _by_name(name)
    assert wheel_problems(find_wheel(wheels, distribution), distribution, VERSIONS, LICENSE) == []


def _copy_without(wheel: Path, target: Path, dropped: str) -> Path:
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(target, "w") as copy:
        for item in source.infolist():
            if item.filename != dropped:
                copy.writestr(item, source.read(item.filename))
    return target


def test_a_wheel_missing_a_source_file_or_the_license_fails_the_check(wheels: Path, tmp_path: Path) -> None:
    llama = _by_name("loader-plugin-llama")
    wheel = find_wheel(wheels, llama)
    (tmp_path / "no-marker").mkdir()
    no_marker = _copy_without(wheel, tmp_path / "no-marker" / wheel.name, "loader_plugin_llama/py.typed")
    assert wheel_problems(no_marker, llama, VERSIONS, LICENSE) == [
        f"loader-plugin-llama: {wheel.name} lacks 1 file(s) of src/loader_plugin_llama: loader_plugin_llama/py.typed"]
    (tmp_path / "no-license").mkdir()
    no_license = _copy_without(wheel, tmp_path / "no-license" / wheel.name,
                               "loader_plugin_llama-0.1.0.dist-info/licenses/LICENSE")
    assert wheel_problems(no_license, llama, VERSIONS, LICENSE) == [
        f"loader-plugin-llama: {wheel.name} has no loader_plugin_llama-0.1.0.dist-info/licenses/LICENSE"]


def test_installing_gguf_brings_llama_and_the_core_from_the_wheels(wheels: Path) -> None:
    assert with_requirements(["loader-plugin-gguf"], wheels_by_name(wheels)) == [
        "loader-core", "loader-plugin-gguf", "loader-plugin-llama"]


def test_a_plugin_without_a_wheel_is_refused(wheels: Path, tmp_path: Path) -> None:
    only_core = tmp_path / "only-core"
    only_core.mkdir()
    shutil.copy(find_wheel(wheels, _by_name("loader-core")), only_core)
    with pytest.raises(SystemExit, match=r"^error: no wheel of loader-plugin-gguf among loader-core$"):
        with_requirements(["loader-plugin-gguf"], wheels_by_name(only_core))
