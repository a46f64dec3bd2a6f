"""Safetensors headers read without the tensor bytes: what ``loader inspect`` needs from an object.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header naming each tensor's dtype, shape and byte range. Two ranged
reads (the length, then the header) describe a whole shard, so inspecting an
``s3://`` checkpoint costs a few kilobytes per file, not the file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import attrs

from loader.errors import CheckpointFormatError

__all__ = ["ITEMSIZES", "MAX_HEADER_BYTES", "HeaderEntry", "parse_header", "read_header"]

MAX_HEADER_BYTES = 100 * 1024 * 1024
"""The limit ``safetensors`` itself puts on a header."""

ITEMSIZES = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4,
    "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8,
}
_TORCH_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "I32": "int32",
    "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16", "U8": "uint8",
    "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E8M0": "float8_e8m0fnu",
    "C64": "complex64",
}


@attrs.frozen
class HeaderEntry:
    """One tensor as the header declares it."""

    name: str
    dtype_code: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def torch_name(self) -> str:
        """The torch dtype's attribute name (``"bfloat16"``)."""
        return _TORCH_NAMES[self.dtype_code]


def parse_header(raw: bytes, where: str) -> list[HeaderEntry]:
    """The tensors a header declares, in file order; a malformed header names ``where`` and the field."""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckpointFormatError(f"{where}: safetensors header is not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointFormatError(f"{where}: safetensors header must be a JSON object")
    entries: list[tuple[int, HeaderEntry]] = []
    for name, info in data.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise CheckpointFormatError(f"{where}: header entry {name!r} must be an object")
        code, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if code not in ITEMSIZES:
            raise CheckpointFormatError(f"{where}: tensor {name!r} has unknown dtype {code!r}")
        if (not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape)
                or not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and o >= 0 for o in offsets) or offsets[0] > offsets[1]):
            raise CheckpointFormatError(f"{where}: tensor {name!r} has a malformed shape or data_offsets")
        nbytes = math.prod(shape) * ITEMSIZES[code]
        if offsets[1] - offsets[0] != nbytes:
            raise CheckpointFormatError(
                f"{where}: tensor {name!r} spans {offsets[1] - offsets[0]} bytes, but {code} {shape} needs {nbytes}"
            )
        entries.append((offsets[0], HeaderEntry(name, code, tuple(shape), nbytes)))
    entries.sort(key=lambda e: e[0])
    return [entry for _, entry in entries]


def read_header(read_range: Callable[[int, int], bytes], size: int, where: str) -> list[HeaderEntry]:
    """Read and parse the header of a file of ``size`` bytes through ``read_range(start, length)``."""
    if size < 8:
        raise CheckpointFormatError(f"{where}: {size} bytes is too short for a safetensors file")
    length = int.from_bytes(read_range(0, 8), "little")
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise CheckpointFormatError(
            f"{where}: header length {length} does not fit the file of {size} bytes (at most {MAX_HEADER_BYTES})"
        )
    raw = read_range(8, length)
    if len(raw) != length:
        raise CheckpointFormatError(f"{where}: file ends inside its header (got {len(raw)} of {length} bytes)")
    return parse_header(raw, where)
