"""The user's request to :func:`loader.load_model`, validated once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from .errors import UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "LoadOptions", "parse_dtype"]

DTYPES = ("float32", "float16", "bfloat16")


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
    the checkpoint declares.
    """

    dtype: torch.dtype
    device: torch.device
    load_format: str = "auto"
    quantization: str | None = None
    revision: str | None = None
    extra: dict[str, Any] = attrs.field(factory=dict, eq=False, hash=False)
