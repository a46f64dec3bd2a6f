"""``docs/hooks.md``: the hook reference, rendered from the hookspecs' own docstrings and signatures."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import Any

INTRO = """\
# Hook reference

Generated from `core/loader/hookspecs.py` by `python scripts/gen_docs.py`; do not edit by hand.

Implement a hook in your plugin's entry-point module with `@loader.hookimpl`. An implementation may
accept fewer arguments than the spec lists. Hooks marked *firstresult* stop at the first non-`None` answer.
The core calls every hook through pluggy, so `tryfirst`/`trylast` order implementations and
`wrapper=True` (or old-style `hookwrapper=True`) implementations wrap the others, as pluggy documents.
"""


def hook_specs(hookspecs: ModuleType) -> list[tuple[str, Callable[..., Any]]]:
    """The hooks ``hookspecs`` declares (functions carrying the project's spec marker), in source order."""
    marker = f"{hookspecs.PROJECT_NAME}_spec"
    specs = [(name, func) for name, func in vars(hookspecs).items()
             if inspect.isfunction(func) and getattr(func, marker, None) is not None]
    return sorted(specs, key=lambda spec: spec[1].__code__.co_firstlineno)


def hook_heading(name: str) -> str:
    """The heading each hook gets; the coverage check looks for exactly this line."""
    return f"## `{name}`"


def render_hooks(hookspecs: ModuleType) -> str:
    lines = [INTRO]
    marker = f"{hookspecs.PROJECT_NAME}_spec"
    for name, func in hook_specs(hookspecs):
        signature = str(inspect.signature(func)).replace("'", "")
        lines += [hook_heading(name), "", "```python", f"def {name}{signature}", "```", ""]
        if (getattr(func, marker) or {}).get("firstresult"):
            lines += ["*firstresult*: the first non-`None` result wins.", ""]
        lines += [inspect.cleandoc(func.__doc__ or ""), ""]
    return "\n".join(lines).rstrip() + "\n"
