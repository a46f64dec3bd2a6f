"""The one list of in-repo plugins, ``plugins/*/pyproject.toml``, written into every file that cannot read it.

A shipped plugin is a folder ``plugins/<name>/`` with a ``pyproject.toml`` whose name does not start with
``_`` (``scripts/distributions.py``; ``plugins/_template`` is a skeleton to copy). The Makefile and the scripts
find them themselves; these files cannot, so this script writes their part from the plugins' ``pyproject.toml``
(the ``[tool.loader]`` table for what a list says about a plugin):

- ``pyproject.toml``: the ``all`` extra (``loader-plugin-<name>>=V,<next minor``) and mypy's ``mypy_path``;
- ``tox.ini``: ``env_list`` (``core``, then the envs already there: a new plugin's after the others), and a
  ``[testenv:<name>]`` for a plugin whose tests no env runs (added once, never rewritten: edit its deps and
  the plugins it installs there);
- ``README.md``: the table of distributions; ``docs/index.md``: the row of plugin pages;
- ``mkdocs.yml``: the Plugins section of the nav;
- ``core/loader/_known_plugins.py``: ``KNOWN_PLUGINS``, what each plugin provides, for the core's
  "pip install loader-plugin-x" hints.

    python scripts/plugin_list.py            # write them (make plugins)
    python scripts/plugin_list.py --check    # write nothing; fail naming each stale file (make lint)
"""

from __future__ import annotations

import argparse
import configparser
import difflib
import json
import re
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from distributions import ROOT, shipped_distributions
from tox_envs import read_envs

__all__ = ["Plugin", "PluginListError", "main", "plugins", "rendered", "stale"]

FIX = "run `make plugins` (python scripts/plugin_list.py)"
SOURCE = "plugins/*/pyproject.toml"
PROVISIONS = ("formats", "quantization", "schemes", "architectures")
ENTRY_POINT_GROUP = "loader.plugins"


class PluginListError(Exception):
    """A plugin's ``pyproject.toml`` lacks what the lists need, or a file lacks the place its list goes."""


@dataclass(frozen=True)
class Plugin:
    """One shipped plugin, as its ``pyproject.toml`` describes it."""

    name: str  # the folder's name, which is also its entry point's name
    distribution: str
    version: str
    summary: str
    docs_page: str  # under docs/
    docs_title: str
    provides: dict[str, tuple[str, ...]]

    @property
    def package(self) -> str:
        return f"loader_plugin_{self.name}"

    @property
    def requirement(self) -> str:
        """``loader-plugin-x>=0.1.0,<0.2``: this version up to the next minor series."""
        major, minor = (int(part) for part in self.version.split(".")[:2])
        return f"{self.distribution}>={self.version},<{major}.{minor + 1}"


def plugins(root: Path = ROOT) -> list[Plugin]:
    """Every shipped plugin, by name, with what ``[tool.loader]`` of its ``pyproject.toml`` says."""
    found = []
    for distribution in shipped_distributions(root)[1:]:
        folder = distribution.project_dir
        where = f"{folder.relative_to(root)}/pyproject.toml"
        data = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
        entry_points = data["project"].get("entry-points", {}).get(ENTRY_POINT_GROUP, {})
        if list(entry_points) != [folder.name]:
            raise PluginListError(f"{where}: the lists name a plugin by its folder, so its one entry point in group "
                                  f"{ENTRY_POINT_GROUP!r} must be named {folder.name!r} (found {list(entry_points)})")
        table = data.get("tool", {}).get("loader")
        if not isinstance(table, dict) or not table.get("summary") or not table.get("docs-page"):
            raise PluginListError(f"{where}: needs a [tool.loader] table with `summary` (its row in README's table) "
                                  "and `docs-page` (its page under docs/); see plugins/_template/pyproject.toml")
        unknown = set(table) - {"summary", "docs-page", "docs-title", *PROVISIONS}
        if unknown:
            raise PluginListError(f"{where}: [tool.loader] has unknown keys {sorted(unknown)}")
        if not (root / "docs" / table["docs-page"]).is_file():
            raise PluginListError(f"{where}: [tool.loader] docs-page = {table['docs-page']!r} is not a file in docs/")
        found.append(Plugin(name=folder.name, distribution=distribution.name, version=distribution.version,
                            summary=table["summary"], docs_page=table["docs-page"],
                            docs_title=table.get("docs-title", folder.name),
                            provides={key: tuple(table.get(key, ())) for key in PROVISIONS}))
    return sorted(found, key=lambda p: p.name)


# --- replacing one part of a file -----------------------------------------------------------------------------

BEGIN = f"begin plugin list: written by `make plugins` from {SOURCE}"
END = "end plugin list"


def _between_markers(text: str, where: str, comment: tuple[str, str], body: list[str]) -> str:
    """``text`` with the lines between its begin and end marker comments replaced by ``body``."""
    opening, closing = comment
    pattern = re.compile(rf"^([ \t]*){re.escape(opening)} begin plugin list\b[^\n]*\n.*?^[ \t]*"
                         rf"{re.escape(opening)} {END}{re.escape(closing)}[ \t]*$", re.M | re.S)
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise PluginListError(f"{where}: expected one block from `{opening} begin plugin list ...{closing}` to "
                              f"`{opening} {END}{closing}`, found {len(matches)}")
    indent = matches[0].group(1)
    block = [f"{indent}{opening} {BEGIN}{closing}", *body, f"{indent}{opening} {END}{closing}"]
    return text[:matches[0].start()] + "\n".join(block) + text[matches[0].end():]


def _toml_array(text: str, where: str, key: str, values: list[str]) -> str:
    """``text`` with the array ``key = [...]`` (at a line's start) holding ``values``, one a line."""
    pattern = re.compile(rf"^{re.escape(key)} = \[[^\]]*\]", re.M)
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise PluginListError(f"{where}: expected one `{key} = [...]`, found {len(matches)}")
    array = "\n".join([f"{key} = [", *(f"    {json.dumps(v)}," for v in values), "]"])
    return text[:matches[0].start()] + array + text[matches[0].end():]


def _line(text: str, where: str, prefix: str, line: str) -> str:
    """``text`` with its one line that starts with ``prefix`` replaced by ``line``."""
    pattern = re.compile(rf"^{re.escape(prefix)}.*$", re.M)
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise PluginListError(f"{where}: expected one line starting with {prefix!r}, found {len(matches)}")
    return text[:matches[0].start()] + line + text[matches[0].end():]


# --- each file's part -----------------------------------------------------------------------------------------

def _pyproject(text: str, found: list[Plugin]) -> str:
    text = _toml_array(text, "pyproject.toml", "all", [p.requirement for p in found])
    return _toml_array(text, "pyproject.toml", "mypy_path", ["core", *(f"plugins/{p.name}/src" for p in found)])


def _test_paths(plugin: Plugin, root: Path) -> list[str]:
    """Where a plugin's tests are: ``tests/plugins/<name>`` (this repository's layout) or the template's."""
    return [f"tests/plugins/{plugin.name}", f"plugins/{plugin.name}/tests"]


def _tested_by(text: str, root: Path) -> set[str]:
    """The paths (and parents of node ids) that some env of ``tox.ini`` gives pytest."""
    return {arg.split("::", 1)[0].rstrip("/") for env in read_envs(root, text).values()
            for args in env.pytest_commands for arg in args if not arg.startswith("-")}


def _tox(text: str, found: list[Plugin], root: Path) -> str:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    tested = _tested_by(text, root)
    for plugin in found:
        if not tested & set(_test_paths(plugin, root)):
            own, template = _test_paths(plugin, root)
            path = template if (root / template).is_dir() and not (root / own).is_dir() else own
            text = text.rstrip("\n") + "\n\n" + "\n".join([
                f"# {plugin.distribution}'s tests with the core and it alone, from their wheels (added by "
                "scripts/plugin_list.py: add the deps its tests need, and the plugins they load after its name)",
                f"[testenv:{plugin.name}]",
                f"commands_pre = {{[wheels]install}} {plugin.name}",
                f"commands = pytest -q {path} {{posargs}}",
            ]) + "\n"
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    current = [e.strip() for e in parser.get("tox", "env_list", fallback="").replace("\n", ",").split(",")
               if e.strip()]
    names = [e for e in current if e != "core" and parser.has_section(f"testenv:{e}")]
    names += [p.name for p in found if p.name not in names and parser.has_section(f"testenv:{p.name}")
              and "external" not in parser.get(f"testenv:{p.name}", "labels", fallback="")]
    return _line(text, "tox.ini", "env_list = ", f"env_list = {', '.join(['core', *names])}")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _readme(text: str, found: list[Plugin], root: Path) -> str:
    core = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    table = core.get("tool", {}).get("loader", {})
    if not table.get("summary") or not table.get("docs-page"):
        raise PluginListError("pyproject.toml: needs a [tool.loader] table with `summary` and `docs-page` "
                              "(loader-core's row in README's table)")
    rows = [(core["project"]["name"], table["summary"], table["docs-page"]),
            *((p.distribution, p.summary, p.docs_page) for p in found)]
    lines = ["| distribution | provides | docs |", "|---|---|---|",
             *(f"| `{name}` | {_cell(summary)} | [{page}](docs/{page}) |" for name, summary, page in rows)]
    return _between_markers(text, "README.md", ("<!--", " -->"), lines)


def _docs_index(text: str, found: list[Plugin]) -> str:
    prefix = "| know what a plugin reads, and its limits |"
    pages = ", ".join(f"[{p.name}]({p.docs_page})" for p in found)
    return _line(text, "docs/index.md", prefix, f"{prefix} the plugin pages: {pages} |")


def _yaml_key(title: str) -> str:
    plain = not re.search(r": |\s#|^[-?:,\[\]{}#&*!|>'\"%@`]", title) and not title.endswith(":")
    return title if plain else json.dumps(title)


def _mkdocs(text: str, found: list[Plugin]) -> str:
    match = re.search(r"^([ \t]*)# begin plugin list", text, re.M)
    indent = match.group(1) if match else "      "
    return _between_markers(text, "mkdocs.yml", ("#", ""),
                            [f"{indent}- {_yaml_key(p.docs_title)}: {p.docs_page}" for p in found])


def _tuple(values: tuple[str, ...]) -> str:
    return "(" + ", ".join(json.dumps(v) for v in values) + ("," if len(values) == 1 else "") + ")"


def _known_plugins(text: str, found: list[Plugin]) -> str:
    lines = ["KNOWN_PLUGINS: tuple[KnownPlugin, ...] = ("]
    for plugin in found:
        fields = [json.dumps(plugin.name)] + [f"{key}={_tuple(values)}" for key, values in plugin.provides.items()
                                              if values]
        line = f"    KnownPlugin({', '.join(fields)}),"
        if len(line) > 120:  # the project's line length: one field a line
            line = "\n".join(["    KnownPlugin(", *(f"        {field}," for field in fields), "    ),"])
        lines.append(line)
    lines.append(")")
    return _between_markers(text, "core/loader/_known_plugins.py", ("#", ""), lines)


def rendered(root: Path = ROOT) -> dict[Path, str]:
    """Each file this script owns a part of, with that part as the plugins' ``pyproject.toml`` say."""
    found = plugins(root)
    renderers: dict[str, Callable[[str], str]] = {
        "pyproject.toml": lambda t: _pyproject(t, found),
        "tox.ini": lambda t: _tox(t, found, root),
        "README.md": lambda t: _readme(t, found, root),
        "docs/index.md": lambda t: _docs_index(t, found),
        "mkdocs.yml": lambda t: _mkdocs(t, found),
        "core/loader/_known_plugins.py": lambda t: _known_plugins(t, found),
    }
    return {root / name: render((root / name).read_text(encoding="utf-8")) for name, render in renderers.items()}


def stale(root: Path = ROOT) -> dict[Path, str]:
    """The files whose part differs from the plugins' ``pyproject.toml``: each with a short diff."""
    found = {}
    for path, text in rendered(root).items():
        current = path.read_text(encoding="utf-8")
        if current != text:
            name = str(path.relative_to(root))
            diff = difflib.unified_diff(current.splitlines(), text.splitlines(), f"{name} (committed)",
                                        f"{name} (from {SOURCE})", n=0, lineterm="")
            found[path] = "\n".join(list(diff)[:24])
    return found


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="write nothing; fail if a file's plugin list is stale")
    args = parser.parse_args(argv)
    try:
        if args.check:
            problems = stale(root)
            for path, diff in problems.items():
                sys.stderr.write(f"error: {path.relative_to(root)}: its plugin list differs from {SOURCE}; {FIX}\n"
                                 f"{diff}\n")
            if problems:
                return 1
            print(f"the plugin lists match {SOURCE}: {', '.join(p.name for p in plugins(root))}")
            return 0
        for path, text in rendered(root).items():
            if path.read_text(encoding="utf-8") != text:
                path.write_text(text, encoding="utf-8")
                print(f"wrote {path.relative_to(root)}")
    except PluginListError as error:
        sys.stderr.write(f"error: {error}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
