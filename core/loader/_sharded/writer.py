"""A minimal safetensors writer for sharded state (the format is a JSON header plus raw bytes).

The core writes this one file shape itself so ``save-sharded`` needs no
format plugin; :mod:`.reader` reads it back through the one safetensors header parser.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch

__all__ = ["DTYPE_CODES", "write_safetensors"]

DTYPE_CODES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def write_safetensors(path: Path, tensors: Sequence[tuple[str, torch.Tensor]],
                      metadata: dict[str, str] | None = None) -> int:
    """Write ``tensors`` (CPU or not) to ``path`` atomically; return the bytes of tensor data."""
    header: dict[str, object] = {"__metadata__": metadata or {}}
    offset = 0
    for name, tensor in tensors:
        if tensor.dtype not in DTYPE_CODES:
            raise TypeError(f"{name}: dtype {tensor.dtype} cannot be stored in safetensors")
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": DTYPE_CODES[tensor.dtype], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as fh:
        fh.write(len(raw).to_bytes(8, "little"))
        fh.write(raw)
        for _, tensor in tensors:
            data = tensor.detach().to("cpu").contiguous()
            if data.numel():
                fh.write(data.view(torch.uint8).reshape(-1).numpy().data)
    os.replace(partial, path)
    return offset
