"""The user's request to :func:`loader.load_model`, validated once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .errors import UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "MODEL_IMPLS", "LoadOptions", "check_model_impl", "parse_dtype"]

DTYPES = ("float32", "float16", "bfloat16")
MODEL_IMPLS = ("auto", "native", "transformers")
"""``model_impl`` values, as vLLM's ``--model-impl``: ``auto`` prefers a native class and falls back,
``native`` never falls back, ``transformers`` always uses the fallback."""


def check_model_impl(value: Any) -> str:
    """Return ``value`` if it is one of :data:`MODEL_IMPLS`, else raise naming it."""
    if isinstance(value, str) and value in MODEL_IMPLS:
        return value
    raise UnsupportedError(f"model_impl {value!r} is not supported; use one of {', '.join(MODEL_IMPLS)}")


def parse_dtype(value: Any) -> torch.dtype:
    """Turn ``"bfloat16"``/``"bf16"``/``torch.bfloat16`` into a torch dtype, or raise."""
    import torch

    if isinstance(value, torch.dtype):
        if value in (torch.float32, torch.float16, torch.bfloat16):
            return value
        raise UnsupportedError(f"dtype {value} is not supported; use one of {', '.join(DTYPES)}")
    aliases = {
        "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
        "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
        "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    }
    if isinstance(value, str) and value.lower() in aliases:
        return aliases[value.lower()]
    raise UnsupportedError(f"dtype {value!r} is not supported; use one of {', '.join(DTYPES)}")


@attrs.frozen
class LoadOptions:
    """Everything a load was asked to do.

    The rank, size, dtype and device of the load in progress are its session's
    (:func:`loader._session.current_session`); ``dtype`` here is the request
    (evolved to the resolved dtype once ``"auto"`` is read from the config).
    ``load_format`` is ``"auto"``, ``"dummy"`` or a format plugin's name;
    ``quantization`` a quantization plugin's method name or ``None`` to use what
    the checkpoint declares. ``extra`` carries, once the checkpoint is prepared,
    ``"dtype_auto"`` (whether the dtype came from ``"auto"``) and
    ``"weight_format"`` (the chosen format's name) and ``"weight_files"`` (its
    files, local paths or URIs), so a quantization plugin can choose a method
    from them (and plan layers from a format's own headers); and the user's
    ``"quantization_options"`` and ``"format_options"``.
    """

    dtype: torch.dtype
    device: torch.device
    load_format: str = "auto"
    quantization: str | None = None
    revision: str | None = None
    model_impl: str = "auto"
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)
