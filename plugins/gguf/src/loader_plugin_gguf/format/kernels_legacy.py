"""Vectorized torch dequantization of ggml's 32-value block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.

Each kernel takes ``blocks``, a contiguous ``uint8`` tensor ``[n, type_size]`` of whole
blocks, and writes float32 values into ``out`` (contiguous ``[n, 32]``). The quantized
integers are cast straight into ``out`` and scaled there in place, so a block costs one
float write plus the in-place passes. The arithmetic follows ggml's reference (and
gguf-py's numpy port) in float32 operation by operation, so results are bit-equal to
``gguf.quants.dequantize``: scales are float16 widened to float32, then ``d * q`` (``+ m``).
"""

from __future__ import annotations

import functools

import torch

__all__ = [
    "dequant_q4_0",
    "dequant_q4_1",
    "dequant_q5_0",
    "dequant_q5_1",
    "dequant_q8_0",
    "half_at",
    "high_bits",
    "nibbles",
    "shifts",
]


@functools.lru_cache(maxsize=64)
def shifts(values: tuple[int, ...], view: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A small ``uint8`` tensor of shift amounts on ``device`` (kernels run wherever the bytes are)."""
    return torch.tensor(values, dtype=torch.uint8, device=device).view(view)


def half_at(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 stored at byte ``start`` of every block, widened to float32, as ``[n, 1]``."""
    # a fresh copy, not .contiguous(): one block at an odd file offset (general.alignment 1) is
    # contiguous already, and a float16 view of it would start at an odd byte
    return blocks[:, start:start + 2].clone(memory_format=torch.contiguous_format).view(torch.float16).to(torch.float32)


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """``[n, k]`` packed bytes -> ``[n, 2k]`` values: all low nibbles first, then all high ones."""
    return torch.cat((qs & 0x0F, qs >> 4), dim=1)


def high_bits(qh: torch.Tensor) -> torch.Tensor:
    """``[n, 4]`` little-endian 32-bit masks -> ``[n, 32]`` bits, bit ``j`` of the mask at column ``j``."""
    n = qh.shape[0]
    return ((qh.unsqueeze(-1) >> shifts(tuple(range(8)), (8,), qh.device)) & 1).reshape(n, 32)


def dequant_q4_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d: f16, qs[16]``: value = d * (nibble - 8)."""
    out.copy_(nibbles(blocks[:, 2:18]).view(torch.int8) - 8)
    out.mul_(half_at(blocks, 0))


def dequant_q4_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d: f16, m: f16, qs[16]``: value = d * nibble + m."""
    out.copy_(nibbles(blocks[:, 4:20]))
    out.mul_(half_at(blocks, 0)).add_(half_at(blocks, 2))


def dequant_q5_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d: f16, qh: u32, qs[16]``: value = d * ((nibble | high_bit << 4) - 16)."""
    q = nibbles(blocks[:, 6:22]) | (high_bits(blocks[:, 2:6]) << 4)
    out.copy_(q.view(torch.int8) - 16)
    out.mul_(half_at(blocks, 0))


def dequant_q5_1(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d: f16, m: f16, qh: u32, qs[16]``: value = d * (nibble | high_bit << 4) + m."""
    out.copy_(nibbles(blocks[:, 8:24]) | (high_bits(blocks[:, 4:8]) << 4))
    out.mul_(half_at(blocks, 0)).add_(half_at(blocks, 2))


def dequant_q8_0(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d: f16, qs: int8[32]``: value = q * d."""
    out.copy_(blocks[:, 2:34].view(torch.int8))
    out.mul_(half_at(blocks, 0))
