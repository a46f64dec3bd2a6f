"""Generate the reference pages (docs/hooks.md, docs/cli.md, the user guide's table of environment variables),
or check them and the docs' coverage (``--check``).

Each generated page is a rendering of the code that defines it (the hookspecs,
the CLI's parser, the declared settings), so it can never drift; ``--check``
fails when a committed page differs from its rendering, or when a hook, a public
API name (``loader._public_api.PUBLIC_MODULES``), a CLI command or flag or a
``LOADER_*`` environment variable is missing from the docs
(``scripts/docgen/coverage.py``), or when the code mentions a ``LOADER_*``
variable that no setting declares (``scripts/docgen/settings_reference.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "core")]

from scripts.docgen.cli_reference import render_cli  # noqa: E402
from scripts.docgen.coverage import missing_from_docs, missing_from_site  # noqa: E402
from scripts.docgen.hook_reference import render_hooks  # noqa: E402
from scripts.docgen.settings_reference import (  # noqa: E402
    missing_settings,
    undeclared_variables,
    with_settings_table,
)

CLI_TEMPLATE = ROOT / "docs" / "_templates" / "cli.md"
USER_GUIDE = ROOT / "docs" / "user-guide.md"
SETTINGS_MODULES = ("loader._settings", "loader_plugin_gguf.settings", "loader_plugin_marlin.settings")
"""The modules declaring ``LOADER_*`` settings: each has ``SETTINGS`` (the users', in table order), and may have
``INTERNAL`` (set by loader for itself, left out of the docs) and ``NOT_VARIABLES`` (names that are no variable).
A plugin's module that declares a variable goes here; the source scan fails until it does."""


def docs_parser() -> argparse.ArgumentParser:
    """The CLI's parser as the docs describe it: SOURCE's help names every first-party URI scheme.

    Left to itself the parser offers only the schemes of the plugins installed
    where it runs, which would make the page depend on the machine it was
    generated on.
    """
    from loader._cli.parser import build_parser
    from loader._known_plugins import KNOWN_PLUGINS

    schemes = ", ".join(f"{s}:// with {p.distribution}" for p in KNOWN_PLUGINS for s in p.schemes)
    return build_parser(source_text="local folder or file (.gguf, .safetensors), Hub id (org/name), "
                                    f"or a URI whose scheme an installed plugin provides ({schemes})")


def hooks_page() -> str:
    from loader import hookspecs

    return render_hooks(hookspecs)


def cli_page() -> str:
    header = ("<!-- Generated from docs/_templates/cli.md and the CLI's parser (core/loader/_cli/parser.py) by "
              "`python scripts/gen_docs.py`; edit those, not this file. -->\n\n")
    return header + render_cli(docs_parser(), CLI_TEMPLATE.read_text(encoding="utf-8"))


def declared_settings() -> tuple[list[Any], list[Any], dict[str, str]]:
    """The user settings (core first, then each plugin's), the internal ones and the names that are no variable."""
    import importlib

    users: list[Any] = []
    internal: list[Any] = []
    not_variables: dict[str, str] = {}
    for name in SETTINGS_MODULES:
        module = importlib.import_module(name)
        users += module.SETTINGS
        internal += getattr(module, "INTERNAL", ())
        not_variables.update(getattr(module, "NOT_VARIABLES", {}))
    names = [s.name for s in users + internal]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise SystemExit(f"error: declared more than once: {', '.join(twice)}")
    return users, internal, not_variables


def user_guide_page() -> str:
    return with_settings_table(USER_GUIDE.read_text(encoding="utf-8"), declared_settings()[0])


GENERATED: dict[Path, Callable[[], str]] = {
    ROOT / "docs" / "hooks.md": hooks_page,
    ROOT / "docs" / "cli.md": cli_page,
    USER_GUIDE: user_guide_page,
}


def public_api() -> dict[str, frozenset[str]]:
    from loader._public_api import PUBLIC_MODULES, public_names

    return {m: public_names(m) for m in PUBLIC_MODULES}


def coverage_problems() -> list[str]:
    from loader import hookspecs

    users, internal, not_variables = declared_settings()
    return [
        *missing_from_docs(ROOT, hookspecs, docs_parser(), public_api()),
        *missing_settings(USER_GUIDE.read_text(encoding="utf-8"), users, internal),
        *undeclared_variables(ROOT, [s.name for s in users + internal], not_variables),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; fail if a generated page is out of date or the docs miss something")
    parser.add_argument("--check-site", metavar="SITE", type=Path,
                        help="write nothing; fail if the site mkdocs built in SITE lacks a public API name")
    args = parser.parse_args()
    if args.check_site:
        problems = missing_from_site(args.check_site, public_api())
        if problems:
            sys.stderr.write("".join(f"error: {p}\n" for p in problems))
            return 1
        print(f"{args.check_site} renders every public API name")
        return 0
    stale = []
    for target, render in GENERATED.items():
        text = render()
        name = target.relative_to(ROOT)
        if args.check:
            if not target.is_file() or target.read_text(encoding="utf-8") != text:
                stale.append(f"error: {name} is out of date; run python scripts/gen_docs.py")
        else:
            target.write_text(text, encoding="utf-8")
            print(f"wrote {name}")
    if not args.check:
        return 0
    problems = stale + [f"error: {p}" for p in coverage_problems()]
    if problems:
        sys.stderr.write("\n".join(problems) + "\n")
        return 1
    print(f"{', '.join(str(t.relative_to(ROOT)) for t in GENERATED)} are current; the docs cover every hook, "
          "public API name, CLI flag and environment variable")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
