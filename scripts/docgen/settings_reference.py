"""The user guide's table of ``LOADER_*`` environment variables, rendered from their declarations.

The table is a generated block inside ``docs/user-guide.md`` (between :data:`BEGIN` and :data:`END`), one row
per :class:`loader.settings.Setting` the core (``loader._settings.SETTINGS``) and the first-party plugins
declare. :func:`undeclared_variables` is the other half of the check: every ``LOADER_*`` name the code of
the core and the plugins mentions must be declared (a user setting or an internal one), so a variable read
with ``os.environ`` past the declarations fails ``scripts/gen_docs.py --check`` too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

BEGIN = ("<!-- settings: generated from the declared settings (loader.settings.Setting) by "
         "`python scripts/gen_docs.py`; edit the declarations, not this table -->")
END = "<!-- /settings -->"
VARIABLE = re.compile(r"\bLOADER_[A-Z0-9_]*[A-Z0-9]\b")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_settings_table(settings: Iterable[Any]) -> str:
    """A Markdown table: variable, what it accepts, its default, what it does."""
    lines = ["| variable | accepts | default | effect |", "|---|---|---|---|"]
    lines += [f"| `{s.name}` | {_cell(s.kind.expected)} | {_cell(s.default_text())} | {_cell(s.doc)} |"
              for s in settings]
    return "\n".join(lines) + "\n"


def _block_span(page: str, where: str) -> tuple[int, int]:
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{where}: no generated settings block ({BEGIN!r} ... {END!r})")
    return start + len(BEGIN), end


def with_settings_table(page: str, settings: Iterable[Any], where: str = "docs/user-guide.md") -> str:
    """``page`` with its generated block replaced by the current table."""
    start, end = _block_span(page, where)
    return page[:start] + "\n" + render_settings_table(settings) + page[end:]


def documented_variables(page: str, where: str = "docs/user-guide.md") -> set[str]:
    """The variables the generated block's rows name."""
    start, end = _block_span(page, where)
    return {m.group(1) for m in re.finditer(r"^\| `(LOADER_[A-Z0-9_]+)` \|", page[start:end], re.M)}


def missing_settings(page: str, settings: Iterable[Any], internal: Iterable[Any],
                     where: str = "docs/user-guide.md") -> list[str]:
    """Each user setting the table lacks, and each internal one it shows."""
    try:
        documented = documented_variables(page, where)
    except ValueError as exc:
        return [str(exc)]
    problems = [f"{where}: environment variable {s.name} is not documented (run python scripts/gen_docs.py)"
                for s in settings if s.name not in documented]
    problems += [f"{where}: {s.name} is internal (loader sets it for itself) but is in the users' table"
                 for s in internal if s.name in documented]
    return problems


def source_files(root: Path) -> list[Path]:
    """The Python sources of the core and of every plugin (the template included)."""
    files = sorted((root / "core" / "loader").rglob("*.py"))
    for plugin in sorted((root / "plugins").glob("*/src")):
        files += sorted(plugin.rglob("*.py"))
    return files


def undeclared_variables(root: Path, declared: Iterable[str], not_variables: Mapping[str, str]) -> list[str]:
    """Each ``LOADER_*`` name a source under ``root`` mentions that no setting declares, with where it is."""
    known = set(declared) | set(not_variables)
    first_seen: dict[str, str] = {}
    for path in source_files(root):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in VARIABLE.finditer(line):
                if match.group(0) not in known:
                    first_seen.setdefault(match.group(0), f"{path.relative_to(root)}:{number}")
    return [f"{where}: {name} is not declared as a setting (loader._settings, or the plugin's own settings "
            "module listed in scripts/gen_docs.py)" for name, where in sorted(first_seen.items())]
