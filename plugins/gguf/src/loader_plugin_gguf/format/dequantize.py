"""Turn GGUF tensor bytes into values of any float dtype, chunk by chunk.

The supported ggml types are listed here once: three float types that are only
reinterpreted, and the block types whose kernels live in :mod:`.kernels_legacy` and
:mod:`.kernels_kquants`. Block types are dequantized in chunks of 1M values written straight
into a float32 destination (or through one reused float32 chunk for half-precision targets),
so temporaries stay in cache and a bfloat16 load never holds a float32 copy of a tensor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf.constants import GGMLQuantizationType

from .kernels_kquants import dequant_q2_k, dequant_q3_k, dequant_q4_k, dequant_q5_k, dequant_q6_k
from .kernels_legacy import dequant_q4_0, dequant_q4_1, dequant_q5_0, dequant_q5_1, dequant_q8_0
from .tensor_table import GGML_BLOCK_SIZES

__all__ = [
    "BLOCK_KERNELS",
    "FLOAT_TYPES",
    "SUPPORTED_TYPES",
    "dequantize",
    "dequantize_into",
    "is_supported",
    "natural_dtype",
    "row_bytes",
]

Q = GGMLQuantizationType
FLOAT_TYPES: dict[int, torch.dtype] = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
BLOCK_KERNELS: dict[int, Callable[[torch.Tensor, torch.Tensor], None]] = {
    Q.Q4_0: dequant_q4_0, Q.Q4_1: dequant_q4_1, Q.Q5_0: dequant_q5_0, Q.Q5_1: dequant_q5_1,
    Q.Q8_0: dequant_q8_0, Q.Q2_K: dequant_q2_k, Q.Q3_K: dequant_q3_k, Q.Q4_K: dequant_q4_k,
    Q.Q5_K: dequant_q5_k, Q.Q6_K: dequant_q6_k,
}
SUPPORTED_TYPES = tuple(Q(t).name for t in (*FLOAT_TYPES, *BLOCK_KERNELS))
CHUNK_VALUES = 1 << 20


def is_supported(ggml_type: int) -> bool:
    return ggml_type in FLOAT_TYPES or ggml_type in BLOCK_KERNELS


def natural_dtype(ggml_type: int) -> torch.dtype:
    """What a read returns without a dtype: the stored float type, float32 for blocks."""
    return FLOAT_TYPES.get(ggml_type, torch.float32)


def block_shape(ggml_type: int) -> tuple[int, int]:
    """``(values per block, bytes per block)``; ``(1, itemsize)`` for float types."""
    return GGML_BLOCK_SIZES[ggml_type]


def row_bytes(ggml_type: int, values: int) -> int:
    """Bytes that ``values`` consecutive values of one row occupy (``values`` whole blocks)."""
    block, size = block_shape(ggml_type)
    return values // block * size


def _copy_floats(raw: torch.Tensor, stored: torch.dtype, out: torch.Tensor) -> None:
    """``out[:] = raw`` reinterpreted as ``stored``, wherever in the file ``raw`` starts.

    A view of the map as ``stored`` needs a byte offset that is a multiple of its size;
    ``general.alignment`` 1 or 2 (valid: gguf-py and ggml read them) puts tensors anywhere.
    Then bytes are copied as bytes when no conversion is needed, else through aligned
    chunks of at most ``CHUNK_VALUES`` values.
    """
    if raw.storage_offset() % stored.itemsize == 0:
        out.copy_(raw.contiguous().view(stored).reshape(out.shape))
        return
    if out.dtype == stored and out.is_contiguous():
        out.view(torch.uint8).view(raw.shape).copy_(raw)
        return
    rows = out.view(raw.shape[0], -1)
    step = max(1, CHUNK_VALUES // max(1, rows.shape[1]))
    for start in range(0, raw.shape[0], step):
        stop = min(start + step, raw.shape[0])
        aligned = raw[start:stop].clone(memory_format=torch.contiguous_format)
        rows[start:stop].copy_(aligned.view(stored))


def dequantize_into(raw: torch.Tensor, ggml_type: int, out: torch.Tensor) -> None:
    """Write the values of ``raw`` (``uint8 [rows, row_bytes]``, whole blocks) into ``out`` (``[rows, cols]``).

    ``out`` must be a contiguous CPU tensor of a float dtype; nothing else is allocated
    beyond one chunk's temporaries.
    """
    if ggml_type in FLOAT_TYPES:
        _copy_floats(raw, FLOAT_TYPES[ggml_type], out)
        return
    kernel = BLOCK_KERNELS[ggml_type]
    block, size = block_shape(ggml_type)
    blocks = raw.reshape(-1, size) if raw.is_contiguous() else raw.contiguous().reshape(-1, size)
    dest = out.view(-1, block)
    step = max(1, CHUNK_VALUES // block)
    direct = out.dtype == torch.float32
    scratch = None if direct else torch.empty(min(step, blocks.shape[0]), block, device=out.device)
    for start in range(0, blocks.shape[0], step):
        stop = min(start + step, blocks.shape[0])
        if scratch is None:
            kernel(blocks[start:stop], dest[start:stop])
        else:
            part = scratch[: stop - start]
            kernel(blocks[start:stop], part)
            dest[start:stop].copy_(part)


def dequantize(raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...],
               dtype: torch.dtype | None = None) -> torch.Tensor:
    """A new contiguous tensor of ``shape`` and ``dtype`` (default: :func:`natural_dtype`)."""
    out = torch.empty(shape, dtype=dtype or natural_dtype(ggml_type))
    dequantize_into(raw, ggml_type, out.view(-1, shape[-1]) if out.ndim != 2 else out)
    return out
