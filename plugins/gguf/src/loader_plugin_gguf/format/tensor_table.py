"""The GGUF tensor table checked against ggml's layout rules: where each tensor's bytes are.

``gguf_init`` (ggml/src/gguf.cpp) is the reference every GGUF producer writes for and
llama.cpp loads through. Its rules, applied here in the same order:

- ``general.alignment``, when present, is a ``UINT32`` power of two (1 and 2 included);
  any other value type is refused, as gguf-py's reader refuses it too;
- the data section starts at the end of the header padded to the alignment;
- tensor *i* starts exactly where tensor *i-1* ended, padded to the alignment (the first
  at 0): tensors come in table order with no gap and no overlap -- so no two tensors
  share bytes and no checkpoint value is read twice or shifted;
- the file holds the whole data section, the last tensor's padding included, as ggml reads
  it (every GGUF writer pads each tensor): a file cut inside that padding was cut short;
- a tensor may have no elements (a zero dimension): it is read as an empty tensor.

Block sizes are ggml's (``GGML_BLOCK_SIZES``): gguf-py's table, corrected where it differs.

Every refusal names the file and the key or tensor, and says what ggml expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from loader.errors import CheckpointFormatError, UnsupportedError

__all__ = ["ALIGNMENT_KEY", "DEFAULT_ALIGNMENT", "GGML_BLOCK_SIZES", "TableEntry", "TensorInfo", "alignment_of",
           "build_tensor_table"]

ALIGNMENT_KEY = "general.alignment"
DEFAULT_ALIGNMENT = 32
MAX_BYTES = 2**64 - 1  # ggml sizes a tensor in a size_t
GGML_BLOCK_SIZES: dict[int, tuple[int, int]] = {
    **{int(t): sizes for t, sizes in GGML_QUANT_SIZES.items()},
    # ggml-common.h, where gguf-py 0.19 differs: block_q8_1 holds two halves and 32 int8 (gguf-py
    # lists the float d, s of an older layout), and Q2_0 (64 values in 18 bytes) it lacks
    int(GGMLQuantizationType.Q8_1): (32, 36),
    42: (64, 18),
}
"""Values and bytes per block of each ggml type a GGUF file may hold, as ggml lays them out."""
TableEntry = tuple[str, tuple[int, ...], int, int]
"""One raw entry as the header lists it: name, shape (torch order), ggml type, data offset."""


@attrs.frozen
class TensorInfo:
    """One entry of the tensor table. ``shape`` is in torch order (``(out, in)``), the reverse of ggml's."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int  # absolute offset of the first byte in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        try:
            return GGMLQuantizationType(self.ggml_type).name
        except ValueError:
            return f"type {self.ggml_type}"


def alignment_of(path: Path, metadata: Mapping[str, Any], value_types: Mapping[str, int]) -> int:
    """``general.alignment`` (default 32), refused unless a ``UINT32`` power of two, as ggml requires."""
    if ALIGNMENT_KEY not in metadata:
        return DEFAULT_ALIGNMENT
    vtype = value_types.get(ALIGNMENT_KEY)
    if vtype != GGUFValueType.UINT32:
        try:
            type_name = GGUFValueType(vtype).name if vtype is not None else "unknown"
        except ValueError:
            type_name = f"type {vtype}"
        raise CheckpointFormatError(
            f"{path}: metadata key {ALIGNMENT_KEY!r} has value type {type_name}; expected UINT32 "
            "(ggml's gguf_init and gguf-py refuse any other)"
        )
    alignment = metadata[ALIGNMENT_KEY]
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise CheckpointFormatError(f"{path}: metadata key {ALIGNMENT_KEY!r} is {alignment!r}; "
                                    "expected a power of two")
    return alignment


def _block_size(info_name: str, ggml_type: int, path: Path) -> tuple[int, int]:
    if ggml_type not in GGML_BLOCK_SIZES:
        raise UnsupportedError(
            f"{path}: tensor {info_name!r} has ggml type {ggml_type}, which no GGUF reader knows"
        )
    return GGML_BLOCK_SIZES[ggml_type]


def _padded(nbytes: int, alignment: int) -> int:
    return -(-nbytes // alignment) * alignment


def _overlapped(tensors: Sequence[TensorInfo], start: int) -> str:
    """`` (overlaps tensor 'x')`` when ``start`` falls inside an earlier tensor's bytes, else empty."""
    for earlier in tensors:
        if earlier.offset <= start < earlier.offset + max(earlier.nbytes, 1):
            return f", so it overlaps tensor {earlier.name!r}"
    return ""


def build_tensor_table(path: Path, entries: Sequence[TableEntry], *, data_start: int, alignment: int,
                       file_size: int) -> tuple[TensorInfo, ...]:
    """Check every entry and the layout ggml requires; return the tensors with absolute offsets.

    Names come first, as ggml checks them while reading the table: a file with a duplicate name is
    refused for that, whether or not its data is there.
    """
    _refuse_duplicates(path, entries)
    tensors: list[TensorInfo] = []
    expected = 0
    for name, shape, ggml_type, offset in entries:
        block, type_size = _block_size(name, ggml_type, path)
        if shape[-1] % block:
            raise CheckpointFormatError(
                f"{path}: tensor {name!r} has rows of {shape[-1]} values, not a multiple of the "
                f"{TensorInfo(name, shape, ggml_type, 0, 0).type_name} block size {block}"
            )
        if offset % alignment:
            raise CheckpointFormatError(f"{path}: tensor {name!r} starts at data offset {offset}, "
                                        f"not a multiple of the alignment {alignment}")
        nbytes = math.prod(shape) // block * type_size
        if nbytes > MAX_BYTES:
            raise CheckpointFormatError(f"{path}: tensor {name!r} of shape {list(shape)} needs {nbytes} bytes, "
                                        f"more than ggml can address ({MAX_BYTES})")
        start = data_start + offset
        if start + nbytes > file_size:
            raise CheckpointFormatError(
                f"{path}: tensor {name!r} data runs past the end of the file: it needs bytes "
                f"[{start}, {start + nbytes}) but the file has {file_size} bytes"
            )
        if offset != expected:
            raise CheckpointFormatError(
                f"{path}: tensor {name!r} starts at data offset {offset}{_overlapped(tensors, start)}; "
                f"ggml requires {expected}: tensors lie in table order, each padded to the alignment "
                f"{alignment}, with no gap or overlap"
            )
        expected += _padded(nbytes, alignment)
        tensors.append(TensorInfo(name, shape, ggml_type, start, nbytes))
    if tensors and data_start + expected > file_size:
        raise CheckpointFormatError(
            f"{path}: the data section (every tensor padded to the alignment {alignment}) ends at byte "
            f"{data_start + expected}, past the end of the file ({file_size} bytes): the file was cut short"
        )
    return tuple(tensors)


def _refuse_duplicates(path: Path, entries: Sequence[TableEntry]) -> None:
    seen: set[str] = set()
    for name, _, _, _ in entries:
        if name in seen:
            raise CheckpointFormatError(f"{path}: tensor {name!r} appears twice in the tensor table")
        seen.add(name)

