"""The JSON header bitsandbytes stores next to each packed 4-bit weight.

``transformers`` saves a 4-bit weight as the packed ``uint8`` bytes plus
sibling tensors; the non-tensor part of the quantization state (quant type,
blocksize, original dtype and shape, the nested-quantization constants) is
JSON serialized into a ``uint8`` tensor named
``<weight>.quant_state.bitsandbytes__nf4`` (or ``__fp4``). This module turns
those bytes into a typed :class:`QuantStateHeader`, failing with the tensor's
name when anything is off, because a silently wrong blocksize or shape would
dequantize garbage.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import attrs

from loader.errors import CheckpointFormatError

if TYPE_CHECKING:
    import torch

__all__ = [
    "BLOCKSIZES",
    "QUANT_STATE_PREFIX",
    "QUANT_TYPES",
    "QuantStateHeader",
    "parse_quant_state",
]

QUANT_TYPES = ("nf4", "fp4")
BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
QUANT_STATE_PREFIX = "quant_state.bitsandbytes__"
_WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
_MAX_HEADER_BYTES = 1 << 16


@attrs.frozen
class QuantStateHeader:
    """What a packed weight's ``quant_state`` JSON says.

    ``shape`` is the logical ``(out_features, in_features)`` of the weight;
    ``dtype`` the dtype it was quantized from (and dequantizes to). The
    ``nested_*`` fields are set only for double quantization, where the
    per-block ``absmax`` is itself 8-bit quantized in blocks of
    ``nested_blocksize`` around ``nested_offset``.
    """

    quant_type: str
    blocksize: int
    dtype: str
    shape: tuple[int, int]
    nested_blocksize: int | None = None
    nested_dtype: str | None = None
    nested_offset: float | None = None

    @property
    def nested(self) -> bool:
        return self.nested_blocksize is not None

    @property
    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def packed_bytes(self) -> int:
        """Bytes of packed data: two 4-bit codes per byte."""
        return (self.numel + 1) // 2

    @property
    def blocks(self) -> int:
        """Number of ``absmax`` entries: one per (possibly partial) block."""
        return -(-self.numel // self.blocksize)

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.dtype)  # type: ignore[no-any-return]


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    if key not in data:
        raise CheckpointFormatError(f"{what}: quant_state JSON has no {key!r}")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CheckpointFormatError(f"{what}: quant_state field {key!r} has the wrong type ({value!r})")
    return value


def parse_quant_state(raw: torch.Tensor, name: str, what: str) -> QuantStateHeader:
    """Decode the ``quant_state`` tensor called ``name``.

    :param raw: the tensor's values (``uint8`` bytes of UTF-8 JSON).
    :param name: the tensor's checkpoint name; its suffix names the quant type.
    :param what: how error messages refer to the tensor (name and file).
    :raises CheckpointFormatError: for anything but a well-formed header.
    """
    import torch

    suffix = name.rsplit(".", 1)[-1]
    name_type = suffix.removeprefix("bitsandbytes__")
    if not suffix.startswith("bitsandbytes__") or name_type not in QUANT_TYPES:
        raise CheckpointFormatError(
            f"{what}: expected a name ending in {QUANT_STATE_PREFIX}nf4 or {QUANT_STATE_PREFIX}fp4"
        )
    if raw.dtype != torch.uint8 or raw.ndim != 1 or raw.numel() > _MAX_HEADER_BYTES:
        raise CheckpointFormatError(
            f"{what}: quant_state must be a 1-D uint8 tensor of at most {_MAX_HEADER_BYTES} bytes, "
            f"found {raw.dtype} of shape {tuple(raw.shape)}"
        )
    try:
        data = json.loads(bytes(raw.tolist()).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise CheckpointFormatError(f"{what}: quant_state is not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(data, dict):
        found = type(data).__name__
        raise CheckpointFormatError(f"{what}: quant_state JSON must be an object, found {found}")

    quant_type = _field(data, "quant_type", str, what)
    if quant_type != name_type:
        raise CheckpointFormatError(
            f"{what}: quant_state says quant_type {quant_type!r} but the tensor name says {name_type!r}"
        )
    blocksize = _field(data, "blocksize", int, what)
    if blocksize not in BLOCKSIZES:
        raise CheckpointFormatError(f"{what}: blocksize {blocksize} is not one of {BLOCKSIZES}")
    dtype = _field(data, "dtype", str, what)
    if dtype not in _WEIGHT_DTYPES:
        raise CheckpointFormatError(f"{what}: dtype {dtype!r} is not one of {_WEIGHT_DTYPES}")
    shape = _field(data, "shape", list, what)
    if len(shape) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in shape):
        raise CheckpointFormatError(
            f"{what}: shape {shape!r} is not the 2-D (out_features, in_features) of a linear weight"
        )
    if "nested_blocksize" not in data:
        return QuantStateHeader(quant_type, blocksize, dtype, (shape[0], shape[1]))
    nested_blocksize = _field(data, "nested_blocksize", int, what)
    if nested_blocksize not in BLOCKSIZES:
        raise CheckpointFormatError(f"{what}: nested_blocksize {nested_blocksize} is not one of {BLOCKSIZES}")
    nested_dtype = _field(data, "nested_dtype", str, what)
    if nested_dtype != "float32":
        raise CheckpointFormatError(f"{what}: nested_dtype {nested_dtype!r} is not 'float32'")
    nested_offset = float(_field(data, "nested_offset", (int, float), what))
    if not math.isfinite(nested_offset):  # json reads Infinity and NaN; either turns every weight into NaN
        raise CheckpointFormatError(f"{what}: 'nested_offset' must be a finite number, found {nested_offset}")
    return QuantStateHeader(
        quant_type, blocksize, dtype, (shape[0], shape[1]), nested_blocksize, nested_dtype, nested_offset
    )
