"""Typed reads of a ``config.json``-shaped mapping, each failure naming the field.

Model configs arrive as plain JSON mappings (``ModelContext.hf_config``); a
typo or a corrupted file must fail with a :class:`~loader.errors.ConfigError`
that says which field is wrong and what was expected, not with a ``KeyError``
or a tensor of absurd size deep inside layer construction. The family config
parsers (Llama, Mistral, Qwen) read every field through :class:`ConfigFields`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from loader.errors import ConfigError

__all__ = ["REQUIRED", "ConfigFields"]


class _Required:
    """Sentinel default: the field must be present."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Final = _Required()


class ConfigFields:
    """Reads fields of one model config; messages start with ``what`` (e.g. the architecture)."""

    def __init__(self, config: Mapping[str, Any], what: str) -> None:
        if not isinstance(config, Mapping):
            raise ConfigError(f"{what}: the model config must be a mapping, found {type(config).__name__}")
        self.config = config
        self.what = what

    def error(self, field: str, expected: str, value: Any) -> ConfigError:
        """A :class:`ConfigError` saying ``field`` should be ``expected`` but is ``value``."""
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        return ConfigError(
            f"{self.what}: config field {field!r} must be {expected}, found {shown} ({type(value).__name__})"
        )

    def has(self, field: str) -> bool:
        """Whether ``field`` is present and not ``null``."""
        return self.config.get(field) is not None

    def _get(self, field: str, default: Any) -> tuple[Any, bool]:
        value = self.config.get(field)
        if value is None:
            if default is REQUIRED:
                raise ConfigError(f"{self.what}: config field {field!r} is required but missing")
            return default, True
        return value, False

    def integer(self, field: str, default: Any = REQUIRED, *, minimum: int = 1,
                maximum: int = 1 << 24) -> int:
        """An integer in ``[minimum, maximum]`` (booleans and floats are refused)."""
        value, defaulted = self._get(field, default)
        if defaulted:
            return value  # type: ignore[no-any-return]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(field, "an integer", value)
        if not minimum <= value <= maximum:
            raise self.error(field, f"an integer in [{minimum}, {maximum}]", value)
        return value

    def optional_integer(self, field: str, *, minimum: int = 1, maximum: int = 1 << 24) -> int | None:
        """Like :meth:`integer`, ``None`` when absent or ``null``."""
        return self.integer(field, None, minimum=minimum, maximum=maximum)  # type: ignore[no-any-return]

    def number(self, field: str, default: Any = REQUIRED, *, minimum: float = 0.0,
               maximum: float = float("inf"), exclusive_minimum: bool = True) -> float:
        """A real number above ``minimum`` (or at it, when not exclusive) and at most ``maximum``."""
        value, defaulted = self._get(field, default)
        if defaulted:
            return value  # type: ignore[no-any-return]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(field, "a number", value)
        value = float(value)
        low_ok = value > minimum if exclusive_minimum else value >= minimum
        if not (low_ok and value <= maximum) or not math.isfinite(value):  # json reads Infinity and NaN
            bound = "above" if exclusive_minimum else "at least"
            upper = "" if maximum == float("inf") else f" and at most {maximum}"
            raise self.error(field, f"a number {bound} {minimum}{upper}", value)
        return value

    def boolean(self, field: str, default: Any = REQUIRED) -> bool:
        """``true`` or ``false``."""
        value, defaulted = self._get(field, default)
        if defaulted:
            return value  # type: ignore[no-any-return]
        if not isinstance(value, bool):
            raise self.error(field, "true or false", value)
        return value

    def string(self, field: str, default: Any = REQUIRED) -> str:
        """A string."""
        value, defaulted = self._get(field, default)
        if defaulted:
            return value  # type: ignore[no-any-return]
        if not isinstance(value, str):
            raise self.error(field, "a string", value)
        return value

    def mapping(self, field: str) -> Mapping[str, Any] | None:
        """A JSON object, ``None`` when absent or ``null``."""
        value = self.config.get(field)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.error(field, "an object", value)
        return value

    def string_list(self, field: str) -> list[str] | None:
        """A list of strings, ``None`` when absent or ``null``."""
        value = self.config.get(field)
        if value is None:
            return None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(field, "a list of strings", value)
        return list(value)

    def integer_list(self, field: str, *, minimum: int = 0, maximum: int = 1 << 24) -> list[int] | None:
        """A list of integers within ``[minimum, maximum]``, ``None`` when absent or ``null``."""
        value = self.config.get(field)
        if value is None:
            return None
        expected = f"a list of integers from {minimum} to {maximum}"
        if not isinstance(value, list) or not all(
                isinstance(v, int) and not isinstance(v, bool) and minimum <= v <= maximum for v in value):
            raise self.error(field, expected, value)
        return list(value)
