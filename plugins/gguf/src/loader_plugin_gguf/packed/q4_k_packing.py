"""GGML's Q4_K super-blocks packed into torch's int4 CPU layout by the core's compiled helpers, read in place.

A Q4_K super-block (256 columns) keeps its codes two per byte in four runs of 32 bytes (byte ``p`` of run ``i``:
column ``64 i + p`` low, ``64 i + 32 + p`` high) and its eight groups' 6-bit scales and mins beside them. The
general path (:func:`~.q4_blocks.affine_rows`, then :func:`loader.kernels.pack_int4`) decodes every code to a
byte and every group's scale and bias to float32 with torch operations, then packs them; the compiled helpers
(:meth:`loader.kernels.NativeRepack.int4pack_q4_k` and :meth:`~loader.kernels.NativeRepack.q4_k_scales`) write
the same codes and scales straight from the blocks (rows in llama.cpp's q/k order read where they lie). Parts that
are not whole super-blocks (a tensor parallel split inside one), rows that do not fill torch's row blocks, a
float16 kernel, or no compiled helpers leave the layer to the general path, which writes the same bytes
(``tests/plugins/gguf/packed/test_q4_k_packing.py``).
"""

from __future__ import annotations

import torch

from loader.kernels import Int4CpuWeight, int4_unsupported_reason, native_repack, torch_int4_block_n
from loader.weights import CheckpointTensor

from .q4_blocks import GROUP_SIZE, Q, gguf_window, super_block_rows

__all__ = ["SUPER_BLOCK", "pack_q4_k_parts"]

SUPER_BLOCK = 256
"""Columns of a Q4_K super-block."""


def _whole_super_blocks(tensor: CheckpointTensor) -> bool:
    """Whether ``tensor`` is a Q4_K window of whole super-blocks (from the header: nothing read)."""
    found = gguf_window(tensor)
    if isinstance(found, str) or found[0].info.ggml_type != Q.Q4_K or len(found[0].shape) != 2:
        return False
    start, cols = found[0].columns
    return start % SUPER_BLOCK == 0 and cols % SUPER_BLOCK == 0


def pack_q4_k_parts(parts: list[CheckpointTensor], dtype: torch.dtype) -> Int4CpuWeight | None:
    """The layer's Q4_K parts (in row order) in torch's int4 layout with ``dtype`` scales, or ``None`` when this
    path does not take them (the general path then packs them)."""
    native, block_n = native_repack(), torch_int4_block_n()
    if native is None or block_n is None or dtype not in (torch.bfloat16, torch.float32):
        return None
    sizes = [int(part.shape[0]) for part in parts]
    n, k = sum(sizes), int(parts[0].shape[-1])
    if any(size % block_n for size in sizes) or int4_unsupported_reason(n, k, GROUP_SIZE) is not None:
        return None
    if not all(_whole_super_blocks(part) for part in parts):
        return None
    data = torch.empty(n * k // 2, dtype=torch.uint8)
    scales_and_zeros = torch.empty(k // GROUP_SIZE, n, 2, dtype=dtype)
    start = 0
    for part, size in zip(parts, sizes, strict=True):
        rows = super_block_rows(part)
        native.int4pack_q4_k(rows.blocks, block_n, data[start * k // 2:(start + size) * k // 2], rows.order)
        native.q4_k_scales(rows.blocks, scales_and_zeros, start, rows.order)
        start += size
    return Int4CpuWeight(data.view(n, k // 2), scales_and_zeros, GROUP_SIZE, k, None)
