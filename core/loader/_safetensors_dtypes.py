"""The safetensors dtype codes every reader of the format understands, without importing torch.

One table for the safetensors plugin, the Run:ai plugin and the core's
sharded-state reader (public through :mod:`loader.checkpoint`). The header
names each tensor's element type with a short code (``"BF16"``,
``"F8_E4M3"``, ...). Parsing and validating a header only needs each code's
item size, so this table keeps the torch dtype as an attribute *name* and
resolves it only when a tensor is read; ``loader inspect`` stays torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .errors import UnsupportedError

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "SUB_BYTE_CODES", "SafetensorsDType", "torch_dtype_of"]


@attrs.frozen
class SafetensorsDType:
    """One element type: its header code, bytes per element and torch dtype name."""

    code: str
    itemsize: int
    torch_name: str

    def torch_dtype(self) -> torch.dtype:
        """The torch dtype (imports torch); :class:`~loader.errors.UnsupportedError` if this torch lacks it."""
        return torch_dtype_of(self)


DTYPES: dict[str, SafetensorsDType] = {
    d.code: d
    for d in (
        SafetensorsDType("F64", 8, "float64"),
        SafetensorsDType("F32", 4, "float32"),
        SafetensorsDType("F16", 2, "float16"),
        SafetensorsDType("BF16", 2, "bfloat16"),
        SafetensorsDType("I64", 8, "int64"),
        SafetensorsDType("I32", 4, "int32"),
        SafetensorsDType("I16", 2, "int16"),
        SafetensorsDType("I8", 1, "int8"),
        SafetensorsDType("U64", 8, "uint64"),
        SafetensorsDType("U32", 4, "uint32"),
        SafetensorsDType("U16", 2, "uint16"),
        SafetensorsDType("U8", 1, "uint8"),
        SafetensorsDType("BOOL", 1, "bool"),
        SafetensorsDType("F8_E4M3", 1, "float8_e4m3fn"),
        SafetensorsDType("F8_E5M2", 1, "float8_e5m2"),
        SafetensorsDType("F8_E4M3FNUZ", 1, "float8_e4m3fnuz"),
        SafetensorsDType("F8_E5M2FNUZ", 1, "float8_e5m2fnuz"),
        SafetensorsDType("F8_E8M0", 1, "float8_e8m0fnu"),
        SafetensorsDType("C64", 8, "complex64"),
    )
}
"""Codes with a whole number of bytes per element, as ``safetensors`` writes them."""

SUB_BYTE_CODES = frozenset({"F4", "F6_E2M3", "F6_E3M2"})
"""Codes the format defines with packed sub-byte elements; recognised, but not readable here."""


def torch_dtype_of(dtype: SafetensorsDType) -> torch.dtype:
    """The torch dtype for a code; :class:`~loader.errors.UnsupportedError` if this torch lacks it."""
    import torch

    found = getattr(torch, dtype.torch_name, None)
    if not isinstance(found, torch.dtype):
        raise UnsupportedError(
            f"safetensors dtype {dtype.code} needs torch.{dtype.torch_name}, which torch "
            f"{torch.__version__} does not provide"
        )
    return found
