"""Generate docs/hooks.md from core/loader/hookspecs.py, or check it is current (``--check``).

The hook reference is written where each hook is declared; this page is only
a rendering of it, so it can never drift from the code.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "docs" / "hooks.md"


def render() -> str:
    sys.path.insert(0, str(ROOT / "core"))
    from loader import hookspecs

    lines = [
        "# Hook reference",
        "",
        "Generated from `core/loader/hookspecs.py` by `python scripts/gen_hook_docs.py`; do not edit by hand.",
        "",
        "Implement a hook in your plugin's entry-point module with `@loader.hookimpl`. An implementation may",
        "accept fewer arguments than the spec lists. Hooks marked *firstresult* stop at the first non-`None` answer.",
        "The core calls every hook through pluggy, so `tryfirst`/`trylast` order implementations and",
        "`wrapper=True` (or old-style `hookwrapper=True`) implementations wrap the others, as pluggy documents.",
        "",
    ]
    members = inspect.getmembers(hookspecs, inspect.isfunction)
    for name, func in sorted(members, key=lambda m: m[1].__code__.co_firstlineno):
        if not name.startswith("loader_"):
            continue
        opts = getattr(func, "loader_spec", {}) or {}
        signature = str(inspect.signature(func)).replace("'", "")
        lines.append(f"## `{name}`")
        lines.append("")
        lines.append("```python")
        lines.append(f"def {name}{signature}")
        lines.append("```")
        lines.append("")
        if opts.get("firstresult"):
            lines.append("*firstresult*: the first non-`None` result wins.")
            lines.append("")
        lines.append(inspect.cleandoc(func.__doc__ or ""))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if docs/hooks.md is out of date")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not TARGET.is_file() or TARGET.read_text() != text:
            sys.stderr.write("error: docs/hooks.md is out of date; run python scripts/gen_hook_docs.py\n")
            return 1
        print("docs/hooks.md is current")
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
