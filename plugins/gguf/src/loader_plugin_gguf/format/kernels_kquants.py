"""Vectorized torch dequantization of ggml's 256-value "K" super-blocks: Q2_K to Q6_K.

Each kernel takes a contiguous ``uint8`` tensor ``[n, type_size]`` of whole super-blocks and
writes float32 values into ``out`` (contiguous ``[n, 256]``), casting the integers straight in
and scaling in place. Layouts and operation order follow ggml's reference
(``dequantize_row_q*_K``) as gguf-py ports it, so results are bit-equal to
``gguf.quants.dequantize``; every step is a whole-tensor torch op, never a loop over blocks.
"""

from __future__ import annotations

import torch

from .kernels_legacy import half_at, shifts

__all__ = ["QK_K", "dequant_q2_k", "dequant_q3_k", "dequant_q4_k", "dequant_q5_k", "dequant_q6_k", "q6_k_codes",
           "scale_min_k4", "split_nibbles"]

QK_K = 256


def _crumbs(packed: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """2-bit fields: ``[n, groups * width]`` bytes -> ``[n, groups, 4, width]`` values (shift 0, 2, 4, 6)."""
    return (packed.reshape(-1, groups, 1, width) >> shifts((0, 2, 4, 6), (1, 1, 4, 1), packed.device)) & 3


def split_nibbles(packed: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """4-bit fields: ``[n, groups * width]`` bytes -> ``[n, groups, 2, width]`` (low nibble, then high)."""
    return (packed.reshape(-1, groups, 1, width) >> shifts((0, 4), (1, 1, 2, 1), packed.device)) & 0x0F


def _bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """1-bit fields: ``[n, width]`` bytes -> ``[n, 1, 8, width]``, bit ``b`` of byte ``i`` at ``[b, i]``."""
    return (packed.reshape(-1, 1, 1, width) >> shifts(tuple(range(8)), (1, 1, 8, 1), packed.device)) & 1


def scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 bytes of eight 6-bit scales and eight 6-bit mins -> two ``[n, 8]`` uint8."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat((d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)), dim=1)
    mn = torch.cat((m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)), dim=1)
    return sc, mn


def dequant_q2_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``scales[16], qs[64], d, dmin``: 16 groups of 16, value = d*sc * q - dmin*m."""
    n = blocks.shape[0]
    scales = blocks[:, 0:16]
    dl = (half_at(blocks, 80) * (scales & 0x0F).to(torch.float32)).reshape(n, 16, 1)
    ml = (half_at(blocks, 82) * (scales >> 4).to(torch.float32)).reshape(n, 16, 1)
    view = out.view(n, 16, 16)
    view.copy_(_crumbs(blocks[:, 16:80], 2, 32).reshape(n, 16, 16))
    view.mul_(dl).sub_(ml)


def dequant_q3_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``hmask[32], qs[64], scales[12], d``: 16 groups of 16 with signed 6-bit scales.

    The high bit is inverted: a set bit in ``hmask`` means no offset, a clear one means -4.
    """
    n = blocks.shape[0]
    scales = blocks[:, 96:108]
    low = split_nibbles(scales[:, 0:8], 1, 8).reshape(n, 16)
    high = _crumbs(scales[:, 8:12], 1, 4).reshape(n, 16)
    sc = ((low | (high << 4)).view(torch.int8) - 32).to(torch.float32)
    dl = (half_at(blocks, 108) * sc).reshape(n, 16, 1)
    ql = _crumbs(blocks[:, 32:96], 2, 32).reshape(n, 16, 16)
    qh = _bits(blocks[:, 0:32], 32).reshape(n, 16, 16) ^ 1
    view = out.view(n, 16, 16)
    view.copy_(ql.view(torch.int8) - (qh << 2).view(torch.int8))
    view.mul_(dl)


def dequant_q4_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d, dmin, scales[12], qs[128]``: 8 groups of 32, value = d*sc * q - dmin*m."""
    n = blocks.shape[0]
    sc, mn = scale_min_k4(blocks[:, 4:16])
    dl = (half_at(blocks, 0) * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (half_at(blocks, 2) * mn.to(torch.float32)).reshape(n, 8, 1)
    view = out.view(n, 8, 32)
    view.copy_(split_nibbles(blocks[:, 16:144], 4, 32).reshape(n, 8, 32))
    view.mul_(dl).sub_(ml)


def dequant_q5_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``d, dmin, scales[12], qh[32], qs[128]``: Q4_K plus a fifth bit per value from ``qh``."""
    n = blocks.shape[0]
    sc, mn = scale_min_k4(blocks[:, 4:16])
    dl = (half_at(blocks, 0) * sc.to(torch.float32)).reshape(n, 8, 1)
    ml = (half_at(blocks, 2) * mn.to(torch.float32)).reshape(n, 8, 1)
    ql = split_nibbles(blocks[:, 48:176], 4, 32).reshape(n, 8, 32)
    qh = _bits(blocks[:, 16:48], 32).reshape(n, 8, 32)
    view = out.view(n, 8, 32)
    view.copy_(ql | (qh << 4))
    view.mul_(dl).sub_(ml)


def q6_k_codes(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K as int8 codes ``q - 32`` ``[n, 16, 16]`` and each 16-group's scale ``d*sc`` (float32 ``[n, 16]``).

    ``d*sc`` (11 by 8 bits) and its product with a code (6 more) are exact in float32, so ``codes * scale``
    is the dequantized value bit for bit — which lets a Q6_K table multiply as int8 (the GGUF head).
    """
    n = blocks.shape[0]
    scales = blocks[:, 192:208].view(torch.int8).to(torch.float32)
    dl = half_at(blocks, 208) * scales
    ql = split_nibbles(blocks[:, 0:128], 2, 64).reshape(n, 8, 32)
    qh = _crumbs(blocks[:, 128:192], 2, 32).reshape(n, 8, 32)
    return ((ql | (qh << 4)).view(torch.int8) - 32).reshape(n, 16, 16), dl.reshape(n, 16)


def dequant_q6_k(blocks: torch.Tensor, out: torch.Tensor) -> None:
    """``ql[128], qh[64], scales: int8[16], d``: 16 groups of 16, value = d*sc * (q - 32)."""
    n = blocks.shape[0]
    codes, dl = q6_k_codes(blocks)
    view = out.view(n, 16, 16)
    view.copy_(codes)
    view.mul_(dl.unsqueeze(-1))
