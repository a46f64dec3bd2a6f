"""Codes packed into int32 words, low bits first, as GPTQ, AWQ and compressed-tensors store them.

Code ``j`` of a word sits at bits ``[bits*j, bits*(j+1))``; a dimension of
``n`` codes is stored as ``n / (32 / bits)`` words. AWQ additionally permutes
the codes within a word; that order is applied by its converter, not here.
"""

from __future__ import annotations

import torch

__all__ = ["pack_int32", "unpack_int32"]


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """``packed`` (int32) with each word expanded into its ``32 // bits`` codes along ``dim``, as uint8."""
    pack = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32, device=packed.device)
    moved = packed.to(torch.int32).movedim(dim, -1)
    codes = (moved.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    codes = codes.reshape(*moved.shape[:-1], moved.shape[-1] * pack)
    return codes.movedim(-1, dim).to(torch.uint8).contiguous()


def pack_int32(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`unpack_int32`: codes in ``[0, 2**bits)`` along ``dim`` into int32 words."""
    pack = 32 // bits
    moved = codes.to(torch.int64).movedim(dim, -1)
    if moved.shape[-1] % pack:
        raise ValueError(f"{moved.shape[-1]} codes do not fill whole int32 words of {pack} codes")
    words = moved.reshape(*moved.shape[:-1], moved.shape[-1] // pack, pack)
    shifts = torch.arange(0, 32, bits, dtype=torch.int64, device=codes.device)
    packed = (words << shifts).sum(-1)
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed)
    return packed.to(torch.int32).movedim(-1, dim).contiguous()
