"""scripts/plugin_list.py: a new plugin folder lands in every list, and a stale list names its file and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts.plugin_list import PluginListError, main, plugins

REPO = Path(__file__).resolve().parents[2]
OWNED = ["pyproject.toml", "tox.ini", "README.md", "docs/index.md", "mkdocs.yml", "core/loader/_known_plugins.py"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The files the script reads and writes, the plugins' pyproject.toml files and the docs' page names."""
    for name in OWNED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    for project in REPO.glob("plugins/*/pyproject.toml"):
        (tmp_path / project.parent.relative_to(REPO)).mkdir(parents=True)
        shutil.copy(project, tmp_path / project.relative_to(REPO))
    for page in REPO.glob("docs/*.md"):
        (tmp_path / "docs" / page.name).touch()
    return tmp_path


def add_plugin(root: Path, name: str, tool_loader: str) -> None:
    """A copy of the template renamed to ``name``, as docs/plugin-authoring.md's in-repository steps make it."""
    text = (REPO / "plugins" / "_template" / "pyproject.toml").read_text(encoding="utf-8")
    text = text.replace("loader-plugin-template", f"loader-plugin-{name}").replace(
        "loader_plugin_template", f"loader_plugin_{name}").replace("template = ", f"{name} = ")
    text = text[:text.index("[tool.loader]")] + tool_loader + "\n[tool.pytest.ini_options]\ntestpaths = [\"tests\"]\n"
    (root / "plugins" / name).mkdir(parents=True)
    (root / "plugins" / name / "pyproject.toml").write_text(text, encoding="utf-8")
    (root / "tests" / "plugins" / name).mkdir(parents=True)


def test_the_plugins_are_the_folders_but_the_template() -> None:
    """(That every file's list matches them is `make lint`'s check: scripts/plugin_list.py --check.)"""
    assert [p.name for p in plugins()] == sorted(p.parent.name for p in REPO.glob("plugins/*/pyproject.toml")
                                                 if not p.parent.name.startswith("_"))


def test_a_new_plugin_is_written_into_every_list(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (repo / "docs" / "npz.md").touch()
    add_plugin(repo, "npz", '[tool.loader]\nsummary = "NumPy `.npz` archives"\ndocs-page = "npz.md"\n'
                            'docs-title = "npz (NumPy)"\nformats = ["npz"]\n')
    assert main(["--check"], root=repo) == 1
    stale = capsys.readouterr().err
    for name in OWNED:
        assert f"error: {name}: its plugin list differs from plugins/*/pyproject.toml; run `make plugins`" in stale

    assert main([], root=repo) == 0
    assert main(["--check"], root=repo) == 0
    read = {name: (repo / name).read_text(encoding="utf-8") for name in OWNED}
    assert '    "loader-plugin-npz>=0.1.0,<0.2",\n' in read["pyproject.toml"]
    assert '    "plugins/npz/src",\n' in read["pyproject.toml"]
    assert "| `loader-plugin-npz` | NumPy `.npz` archives | [npz.md](docs/npz.md) |" in read["README.md"]
    assert "[npz](npz.md)" in read["docs/index.md"]
    assert "      - npz (NumPy): npz.md\n" in read["mkdocs.yml"]
    assert '    KnownPlugin("npz", formats=("npz",)),\n' in read["core/loader/_known_plugins.py"]
    env_list = next(line for line in read["tox.ini"].splitlines() if line.startswith("env_list = "))
    assert "npz" in env_list.split(" = ")[1].split(", ")
    assert "[testenv:npz]\ncommands_pre = {[wheels]install} npz\ncommands = pytest -q tests/plugins/npz {posargs}\n" \
        in read["tox.ini"]

    # written once: a second run changes nothing, and the env added for it is not rewritten
    assert main([], root=repo) == 0
    assert {name: (repo / name).read_text(encoding="utf-8") for name in OWNED} == read


def test_a_plugin_without_its_table_is_refused(repo: Path) -> None:
    add_plugin(repo, "npz", "")
    with pytest.raises(PluginListError, match=r"plugins/npz/pyproject.toml: needs a \[tool.loader\] table"):
        plugins(repo)


def test_a_docs_page_that_is_not_there_is_refused(repo: Path) -> None:
    add_plugin(repo, "npz", '[tool.loader]\nsummary = "x"\ndocs-page = "npz.md"\n')
    with pytest.raises(PluginListError, match=r"docs-page = 'npz.md' is not a file in docs/"):
        plugins(repo)


def test_a_file_without_its_markers_is_named(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    readme = repo / "README.md"
    readme.write_text(readme.read_text(encoding="utf-8").replace("<!-- end plugin list -->", ""), encoding="utf-8")
    assert main(["--check"], root=repo) == 1
    assert "error: README.md: expected one block from `<!-- begin plugin list ... -->`" in capsys.readouterr().err
