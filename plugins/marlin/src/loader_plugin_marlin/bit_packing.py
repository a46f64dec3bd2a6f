"""Codes packed into int32 words, low bits first, as GPTQ, AWQ and compressed-tensors store them.

Code ``j`` of a word sits at bits ``[bits*j, bits*(j+1))``; a dimension of
``n`` codes is stored as ``n / (32 / bits)`` words. AWQ additionally permutes
the codes within a word; that order is applied by its converter, not here.
"""

from __future__ import annotations

import sys

import torch

__all__ = ["pack_int32", "unpack_int32"]


def unpack_int32(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """``packed`` (int32) with each word expanded into its ``32 // bits`` codes along ``dim``, as uint8.

    Runs once per layer at load, so it works on bytes: a little-endian word's
    byte ``b`` holds codes ``[8b / bits, 8(b+1) / bits)``, and each code is
    one uint8 shift and mask of its byte, written straight into its strided
    slot of the result (no int32 copy of the unpacked tensor, no transposing
    copy). On a big-endian machine the same is done with int32 shifts.
    """
    pack = 32 // bits
    mask = (1 << bits) - 1
    words = packed.to(torch.int32).contiguous()
    shape = list(words.shape)
    out = torch.empty([*shape[: dim + 1], pack, *shape[dim + 1:]], dtype=torch.uint8, device=packed.device)
    if sys.byteorder == "little":
        by_byte = words.reshape(-1).view(torch.uint8).reshape(*shape, 4)  # flat first: size-1 dims may have any stride
        for j in range(pack):
            byte = by_byte[..., j * bits // 8]
            shift = j * bits % 8
            out.select(dim + 1, j).copy_(byte if bits == 8 else (byte >> shift) & mask)
    else:
        for j in range(pack):
            out.select(dim + 1, j).copy_((words >> (bits * j)) & mask)
    shape[dim] *= pack
    return out.reshape(shape)


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
