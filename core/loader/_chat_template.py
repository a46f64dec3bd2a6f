"""Render a checkpoint's chat template the way Hugging Face does, without transformers.

Templates come from strangers, so they run in Jinja2's immutable sandbox (no
attribute access to Python internals, no mutation of inputs) and under limits
the sandbox does not set: nesting of template calls (a macro calling itself),
output size, and wall time (nested loops that never end). A template that
breaks one is refused with a :class:`~loader.errors.LoadError` saying which.

The time and depth limits are enforced by a trace function (``sys.settrace``)
installed only while rendering, on this thread: Jinja compiles a template to
Python code, so every loop iteration and macro call of the template is a traced
line or frame. A single call into C that runs long (a huge ``'x' * n`` or
``**``) is not interruptible that way, so those operators are checked before
they run. What remains: a template may still build a large string within the
time limit by repeated concatenation (bounded by the time limit, not by size).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from types import FrameType
from typing import Any

from .errors import LoadError

__all__ = ["MAX_CALL_DEPTH", "MAX_OUTPUT_CHARS", "TIME_LIMIT_S", "render_chat"]

MAX_CALL_DEPTH = 100
"""Nested template frames (macros, call blocks); real templates recurse a few levels for nested JSON schemas."""
MAX_OUTPUT_CHARS = 1_000_000
"""A rendered prompt longer than this (about 250k tokens) is a runaway template, not a conversation."""
TIME_LIMIT_S = 5.0
"""Real templates render in milliseconds, even traced."""

_TEMPLATE_FILE = "<template>"  # the file name Jinja gives code compiled from a string


class _LimitExceeded(Exception):
    """Raised from the tracer or the sandbox when a template breaks a limit."""


def _raise(message: str) -> None:
    raise LoadError(f"chat template: {message}")


class _Limits:
    """The trace function: a deadline checked on every call and template line, and the template's call depth."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.depth = 0

    def _check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _LimitExceeded(f"ran longer than {self.seconds:g} s")

    def on_call(self, frame: FrameType, event: str, arg: Any) -> Any:
        self._check_time()
        if frame.f_code.co_filename != _TEMPLATE_FILE:
            return None
        self.depth += 1
        if self.depth > MAX_CALL_DEPTH:
            raise _LimitExceeded(f"calls nested deeper than {MAX_CALL_DEPTH} (a macro calling itself?)")
        return self.on_line

    def on_line(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            self.depth -= 1
        else:
            self._check_time()
        return self.on_line


def _repeated_length(left: Any, right: Any) -> int:
    """The length ``left * right`` would have when it repeats a string or sequence, else 0."""
    for seq, times in ((left, right), (right, left)):
        if isinstance(seq, str | list | tuple) and isinstance(times, int):
            return len(seq) * times
    return 0


def _power_bits(base: Any, exponent: Any) -> int:
    """About how many bits ``base ** exponent`` needs for integers, else 0."""
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        return exponent * abs(base).bit_length()
    return 0


def _sandbox() -> Any:
    """Jinja2's immutable sandbox, with ``*`` and ``**`` checked before they build something huge."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*" and _repeated_length(left, right) > MAX_OUTPUT_CHARS:
                raise _LimitExceeded(f"output longer than {MAX_OUTPUT_CHARS} characters")
            if operator == "**" and _power_bits(left, right) > 64 * 1024:
                raise _LimitExceeded(f"{left} ** {right} is too large a number")
            return super().call_binop(context, operator, left, right)

    return LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])


def render_chat(template: str, messages: Sequence[dict[str, str]], *, bos_token: str | None = None,
                eos_token: str | None = None, add_generation_prompt: bool = True) -> str:
    """Render ``messages`` with ``template`` (Hugging Face's variables and helpers), within the limits."""
    import jinja2

    env = _sandbox()

    def tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False) -> str:
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    limits = _Limits(TIME_LIMIT_S)
    previous = sys.gettrace()
    chunks: list[str] = []
    size = 0
    try:
        compiled = env.from_string(template)
        sys.settrace(limits.on_call)
        try:
            for chunk in compiled.generate(
                messages=list(messages), bos_token=bos_token or "", eos_token=eos_token or "",
                add_generation_prompt=add_generation_prompt, tools=None, documents=None,
            ):
                size += len(chunk)
                if size > MAX_OUTPUT_CHARS:
                    raise _LimitExceeded(f"output longer than {MAX_OUTPUT_CHARS} characters")
                chunks.append(chunk)
        finally:
            sys.settrace(previous)
    except _LimitExceeded as exc:
        raise LoadError(f"chat template refused: {exc}") from None
    except RecursionError as exc:
        raise LoadError(f"chat template refused: calls nested too deeply ({exc})") from None
    except jinja2.TemplateError as exc:
        raise LoadError(f"chat template cannot be rendered: {exc}") from exc
    return "".join(chunks)
