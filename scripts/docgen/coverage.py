"""Does the committed documentation cover the plugin surface? One line per hook, API name, command or flag it lacks.

Three surfaces, each read from the code that defines it and looked for in the
page that must document it:

- every hook the hookspecs declare has its ``## `name``` heading in ``docs/hooks.md``;
- every name in a public module's ``__all__`` is in the ``members:`` list of that
  module's ``::: module`` block in ``docs/reference/<module>.md`` (and nothing
  else is listed there), so mkdocstrings renders exactly the public API;
- every CLI command has its section in ``docs/cli.md``, and every flag (aliases
  too) appears in backticks in its command's section.

The functions take the surface as an argument (a hookspecs module, a parser, a
``{module: names}`` map) so a test can hand them a patched one.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType

from .cli_reference import GLOBAL, cli_commands, command_heading_prefix
from .hook_reference import hook_heading, hook_specs

REFERENCE_DIR = Path("docs") / "reference"


def missing_hooks(hooks_page: str, hookspecs: ModuleType) -> list[str]:
    headings = set(hooks_page.splitlines())
    return [f"docs/hooks.md: hook {name} is not documented (run python scripts/gen_docs.py)"
            for name, _ in hook_specs(hookspecs) if hook_heading(name) not in headings]


def _sections(page: str) -> dict[str, str]:
    """The page cut at its ``## `` headings: heading line -> the text under it (the intro under ``""``)."""
    sections: dict[str, str] = {}
    heading = ""
    for line in page.splitlines(keepends=True):
        if line.startswith("## "):
            heading = line.rstrip("\n")
        sections[heading] = sections.get(heading, "") + line
    return sections


def missing_cli(cli_page: str, parser: argparse.ArgumentParser) -> list[str]:
    sections = _sections(cli_page)
    problems = []
    for command in cli_commands(parser):
        if command.name == GLOBAL:
            text = sections.get("", "")
        else:
            prefix = command_heading_prefix(command.name)
            found = [body for heading, body in sections.items() if heading == prefix + "`"
                     or heading.startswith(prefix + " ") or heading.startswith(prefix + "`")]
            if not found:
                problems.append(f"docs/cli.md: command 'loader {command.name}' has no section")
                continue
            text = "".join(found)
        where = "loader" if command.name == GLOBAL else f"loader {command.name}"
        problems += [f"docs/cli.md: flag {flag} of '{where}' is not documented"
                     for flag in command.flags if not re.search(rf"`{re.escape(flag)}[` ]", text)]
    return problems


MEMBERS = re.compile(r"^:::\s*(?P<module>[\w.]+)\s*$", re.M)


def documented_members(page: str, module: str) -> list[str] | None:
    """The names listed under ``members:`` in ``page``'s ``::: module`` block; ``None`` without such a block."""
    lines = page.splitlines()
    starts = [i for i, line in enumerate(lines) if (m := MEMBERS.match(line)) and m.group("module") == module]
    if not starts:
        return None
    names: list[str] = []
    in_members = False
    for line in lines[starts[0] + 1:]:
        if line and not line[0].isspace():
            break  # the block's options are indented; the first flush-left line ends it
        stripped = line.strip()
        if stripped == "members:":
            in_members = True
        elif in_members and stripped.startswith("- "):
            names.append(stripped[2:].strip().strip("\"'"))
        elif in_members and stripped:
            in_members = False
    return names


def reference_page(module: str) -> Path:
    return REFERENCE_DIR / f"{module}.md"


def missing_api(root: Path, public: Mapping[str, Iterable[str]]) -> list[str]:
    problems = []
    for module, names in public.items():
        path = reference_page(module)
        page = root / path
        members = documented_members(page.read_text(encoding="utf-8"), module) if page.is_file() else None
        if members is None:
            problems.append(f"{path}: public module {module} has no '::: {module}' block")
            continue
        problems += [f"{path}: public name {module}.{name} is not documented (add it to members:)"
                     for name in sorted(set(names) - set(members))]
        problems += [f"{path}: {module}.{name} is listed but is not in {module}.__all__"
                     for name in members if name not in set(names)]
    return problems


def missing_from_site(site: Path, public: Mapping[str, Iterable[str]]) -> list[str]:
    """Every public name the *built* site has no heading for (``id="module.name"`` on its module's page).

    The ``members:`` lists say what mkdocstrings is asked to render; this says
    what it did render, so a name it could not resolve (a lazily imported
    one, say) is caught too. A name that is itself a public module (``loader.errors``)
    is documented by that module's own page.
    """
    problems = []
    for module, names in public.items():
        page = site / "reference" / module / "index.html"
        html = page.read_text(encoding="utf-8") if page.is_file() else ""
        problems += [f"{page}: public name {module}.{name} was not rendered"
                     for name in sorted(names) if f"{module}.{name}" not in public
                     and f'id="{module}.{name}"' not in html]
    return problems


def missing_from_docs(root: Path, hookspecs: ModuleType, parser: argparse.ArgumentParser,
                      public: Mapping[str, Iterable[str]]) -> list[str]:
    """Everything the docs under ``root`` lack, each surface checked against what the caller hands in."""
    return [
        *missing_hooks((root / "docs" / "hooks.md").read_text(encoding="utf-8"), hookspecs),
        *missing_api(root, public),
        *missing_cli((root / "docs" / "cli.md").read_text(encoding="utf-8"), parser),
    ]
