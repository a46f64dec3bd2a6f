"""Render a checkpoint's chat template the way Hugging Face does, without transformers.

Templates come from strangers, so they run in Jinja2's immutable sandbox
(no attribute access to Python internals, no mutation of inputs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from .errors import LoadError

__all__ = ["render_chat"]


def _raise(message: str) -> None:
    raise LoadError(f"chat template: {message}")


def render_chat(template: str, messages: Sequence[dict[str, str]], *, bos_token: str | None = None,
                eos_token: str | None = None, add_generation_prompt: bool = True) -> str:
    """Render ``messages`` with ``template`` (Hugging Face's variables and helpers)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
        return compiled.render(
            messages=list(messages), bos_token=bos_token or "", eos_token=eos_token or "",
            add_generation_prompt=add_generation_prompt, tools=None, documents=None,
        )
    except jinja2.TemplateError as exc:
        raise LoadError(f"chat template cannot be rendered: {exc}") from exc
