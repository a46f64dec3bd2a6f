"""The format options a tensorizer load takes (``format_options`` / ``--format-option KEY=VALUE``).

Names follow vLLM's ``TensorizerConfig`` and tensorizer's own ``open_stream`` arguments, so a command
that worked there reads the same here.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from loader.errors import UnsupportedError

__all__ = ["KNOWN_OPTIONS", "TensorizerOptions"]

KNOWN_OPTIONS = ("tensorizer_uri", "encryption_keyfile", "s3_endpoint", "s3_access_key_id",
                 "s3_secret_access_key", "num_readers", "verify_hash")

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE or text in _FALSE:
        return text in _TRUE
    raise UnsupportedError(f"format option {name!r} must be yes or no (true/false, 1/0), found {value!r}")


def _readers(value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or not 1 <= number <= 256:
        raise UnsupportedError(f"format option 'num_readers' must be a whole number from 1 to 256, found {value!r}")
    return number


@attrs.frozen
class TensorizerOptions:
    """One load's options; ``None`` keeps tensorizer's default (or the environment's setting)."""

    tensorizer_uri: str | None = None
    """Where the ``.tensors`` file(s) are when SOURCE names the model folder (config, tokenizer), as in vLLM;
    ``%03d`` stands for the rank (``.../model-rank-%03d.tensors``)."""
    encryption_keyfile: Path | None = None
    s3_endpoint: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    num_readers: int | None = None
    verify_hash: bool = False

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> TensorizerOptions:
        """Validate ``format_options``; an unknown key or a bad value names it and what is allowed."""
        unknown = sorted(set(options) - set(KNOWN_OPTIONS))
        if unknown:
            raise UnsupportedError(f"unknown format option(s) {', '.join(map(repr, unknown))} for tensorizer; "
                                   f"known: {', '.join(KNOWN_OPTIONS)}")
        values: dict[str, Any] = {}
        for name, raw in options.items():
            if name == "num_readers":
                values[name] = _readers(raw)
            elif name == "verify_hash":
                values[name] = _flag(name, raw)
            elif name == "encryption_keyfile":
                values[name] = Path(str(raw)).expanduser()
            else:
                values[name] = str(raw)
        return cls(**values)

    def s3_arguments(self) -> dict[str, str]:
        """The S3 settings given, as tensorizer's ``open_stream`` takes them (the rest from the environment)."""
        given = {"s3_endpoint": self.s3_endpoint, "s3_access_key_id": self.s3_access_key_id,
                 "s3_secret_access_key": self.s3_secret_access_key}
        return {name: value for name, value in given.items() if value is not None}
