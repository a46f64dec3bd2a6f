"""Generate the reference pages (docs/hooks.md, docs/cli.md), or check them and the docs' coverage (``--check``).

Each generated page is a rendering of the code that defines it (the hookspecs,
the CLI's parser), so it can never drift; ``--check`` fails when a committed
page differs from its rendering, or when a hook, a public API name
(``loader._public_api.PUBLIC_MODULES``) or a CLI command or flag is missing from
the docs (``scripts/docgen/coverage.py``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "core")]

from scripts.docgen.cli_reference import render_cli  # noqa: E402
from scripts.docgen.coverage import missing_from_docs, missing_from_site  # noqa: E402
from scripts.docgen.hook_reference import render_hooks  # noqa: E402

CLI_TEMPLATE = ROOT / "docs" / "_templates" / "cli.md"


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


GENERATED: dict[Path, Callable[[], str]] = {
    ROOT / "docs" / "hooks.md": hooks_page,
    ROOT / "docs" / "cli.md": cli_page,
}


def public_api() -> dict[str, frozenset[str]]:
    from loader._public_api import PUBLIC_MODULES, public_names

    return {m: public_names(m) for m in PUBLIC_MODULES}


def coverage_problems() -> list[str]:
    from loader import hookspecs

    return missing_from_docs(ROOT, hookspecs, docs_parser(), public_api())


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
          "public API name and CLI flag")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
