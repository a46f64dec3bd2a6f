"""GGML's Q4_0/Q4_1 codes, still two per byte in their half-split order, packed into torch's int4 CPU layout.

A 32-value Q4_0/Q4_1 block stores the code of column ``p`` in the low nibble
of byte ``p`` and that of column ``p + 16`` in its high nibble; torch's layout
(:func:`loader.kernels.torch_int4_block_n`) pairs rows, not columns, in a byte.
These packers build torch's bytes straight from the blocks' nibbles — the bytes
:func:`loader.kernels.pack_int4` writes from the unpacked codes — with the
core's compiled helpers (:func:`loader.kernels.native_repack`) when it has
them, else with byte-level torch operations. Only GGUF's block layouts use
this order, so it lives here rather than in the core.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from loader.kernels import (
    Int4CpuWeight,
    int4_scales_and_zeros,
    int4_unsupported_reason,
    native_repack,
    pack_int4_codes,
    torch_int4_block_n,
)

__all__ = ["HALF_SPLIT_GROUP", "pack_int4_half_split", "pack_int4_half_split_parts"]

HALF_SPLIT_GROUP = 32
"""Columns per group of :func:`pack_int4_half_split`'s byte order (GGML's Q4_0/Q4_1 blocks)."""


def pack_int4_half_split(qs: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor,
                         dtype: torch.dtype = torch.bfloat16) -> Int4CpuWeight:
    """:func:`pack_int4` for codes still packed two per byte in the half-split order, group size 32.

    :param qs: uint8 ``[N, K / 32, 16]`` (any strides, e.g. a view into
        GGUF blocks): byte ``p`` of a group holds the code of column ``p`` in
        its low nibble and of column ``p + 16`` in its high one.
    :param scales: ``[K / 32, N]``; ``biases`` likewise (``w = code * scale + bias``).

    Why: a 4-bit file already stores its codes as nibbles, so torch's layout
    (which pairs rows, not columns, in a byte) is built with four byte
    operations and one transposing copy on half-size tensors, instead of
    widening every code to a byte (or int32, for torch's own op) first — most
    of a packed GGUF load. The bytes are those of :func:`pack_int4` on the
    unpacked codes (``tests/plugins/gguf/packed/test_half_split.py``).
    """
    n, groups, half = (int(s) for s in qs.shape)
    if half != HALF_SPLIT_GROUP // 2:
        raise ValueError(f"half-split codes {tuple(qs.shape)} do not hold groups of {HALF_SPLIT_GROUP} columns")
    if scales.shape != (groups, n) or biases.shape != scales.shape:
        raise ValueError(f"scales {tuple(scales.shape)} and biases {tuple(biases.shape)} do not match "
                         f"half-split codes {tuple(qs.shape)}")
    return pack_int4_half_split_parts([qs], int4_scales_and_zeros(scales, biases, dtype))


def pack_int4_half_split_parts(parts: Sequence[torch.Tensor], scales_and_zeros: torch.Tensor,
                               row_orders: Sequence[torch.Tensor | None] | None = None) -> Int4CpuWeight:
    """:func:`pack_int4_half_split` for a weight whose rows come in parts, its scales already in torch's form.

    :param parts: uint8 ``[N_i, K / 32, 16]`` half-split codes (any strides), the weight's rows in order —
        a fused layer's ``q``/``k``/``v`` or ``gate``/``up`` blocks as read, never concatenated.
    :param scales_and_zeros: ``[K / 32, sum N_i, 2]`` in the kernel's dtype, torch's convention
        (``w = (q - 8) * scale + zero``), built by the caller straight from its file's fields.
    :param row_orders: per part, ``None`` or int64 indices of its rows in the weight's order (the part's rows
        are then ``part[order]``: llama.cpp's interleaved q/k rows, say), read in place by the compiled
        helpers and copied out only for the torch path.

    Why: concatenating a fused layer's parts and stacking its scales were a
    third of a packed GGUF load's packing; each part whose rows start and end
    on the layout's row blocks is transposed straight into place instead.
    """
    orders = list(row_orders) if row_orders is not None else [None] * len(parts)
    if len(orders) != len(parts):
        raise ValueError(f"{len(orders)} row orders for {len(parts)} half-split parts")
    groups = int(parts[0].shape[1])
    n = sum(int(part.shape[0]) if order is None else int(order.numel())
            for part, order in zip(parts, orders, strict=True))
    k = groups * HALF_SPLIT_GROUP
    if any(tuple(part.shape[1:]) != (groups, HALF_SPLIT_GROUP // 2) for part in parts):
        raise ValueError(f"half-split parts {[tuple(part.shape) for part in parts]} do not share "
                         f"[rows, groups, {HALF_SPLIT_GROUP // 2}] columns")
    if tuple(scales_and_zeros.shape) != (groups, n, 2):
        raise ValueError(f"scales and zeros {tuple(scales_and_zeros.shape)} do not match {len(parts)} half-split "
                         f"parts of {n} rows and {groups} groups")
    block_n = torch_int4_block_n()
    if int4_unsupported_reason(n, k, HALF_SPLIT_GROUP) is not None or block_n is None:
        rows = _in_order(parts, orders)
        qs = rows[0] if len(rows) == 1 else torch.cat(rows)
        return pack_int4_codes(torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, k), scales_and_zeros, HALF_SPLIT_GROUP)
    return Int4CpuWeight(_int4pack_from_half_split(parts, block_n, orders), scales_and_zeros, HALF_SPLIT_GROUP, k,
                         None)


def _in_order(parts: Sequence[torch.Tensor], orders: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """Each part's rows in the weight's order (a copy where it has a row order)."""
    return [part if order is None else part.index_select(0, order) for part, order in zip(parts, orders, strict=True)]


_LOW_NIBBLES = 0x0F0F0F0F0F0F0F0F
_HIGH_NIBBLES = -0x0F0F0F0F0F0F0F10  # 0xF0F0F0F0F0F0F0F0 as a signed 64-bit value


def _pair_nibbles_into(first: torch.Tensor, second: torch.Tensor, low_rows: torch.Tensor,
                       high_rows: torch.Tensor) -> None:
    """Pair two sets of half-split rows' nibbles, eight bytes per operation, into ``first`` and ``second``.

    Each byte of ``low_rows`` / ``high_rows`` (int64 words, same shapes as the outputs) holds a column
    ``p`` code low and ``p + 16`` high; ``first`` gets the ``p`` codes (``low_rows``' low, ``high_rows``'
    high nibble), ``second`` the ``p + 16`` codes. One scratch tensor; the outputs may be strided views.
    """
    scratch = torch.bitwise_left_shift(high_rows, 4)
    scratch &= _HIGH_NIBBLES
    torch.bitwise_and(low_rows, _LOW_NIBBLES, out=first)
    first |= scratch
    torch.bitwise_right_shift(low_rows, 4, out=second)
    second &= _LOW_NIBBLES
    torch.bitwise_and(high_rows, _HIGH_NIBBLES, out=scratch)
    second |= scratch


def _by_column(parts: Sequence[torch.Tensor], n: int, block_n: int) -> torch.Tensor:
    """The first ``n // block_n`` row blocks of the parts' rows transposed to ``[B, 2, G, 16, block_n / 2]`` bytes.

    Each block's two halves of rows (the rows a byte of torch's layout pairs) land in two contiguous planes, so
    the nibble pairing runs over long contiguous words (interleaved halves give 4-word runs, which are slower).
    Every part but the last holds whole blocks (:func:`_int4pack_from_half_split` sees to it), so each is
    copied straight into its own blocks.
    """
    groups = int(parts[0].shape[1])
    blocks = n // block_n
    half = block_n // 2
    by_column = torch.empty(blocks, 2, groups, 16, half, dtype=torch.uint8, device=parts[0].device)
    start = 0
    for part in parts:
        size = int(part.shape[0])
        whole = min(size, blocks * block_n - start) // block_n
        if whole > 0:
            first = start // block_n
            source = part[:whole * block_n].view(whole, 2, half, groups, 16).permute(0, 1, 3, 4, 2)
            by_column[first:first + whole].copy_(source)
        start += size
    return by_column


def _int4pack_from_half_split(parts: Sequence[torch.Tensor], block_n: int,
                              orders: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
    """torch's int4 layout (row blocks of :func:`loader.kernels.torch_int4_block_n`) from half-split codes
    ``[N_i, G, 16]``, rows in parts.

    Parts whose boundaries fall inside a row block are concatenated first. With the compiled helpers
    (:func:`loader.kernels.native_repack`) each part's whole blocks are packed in one pass; otherwise one
    byte-level torch copy transposes
    each block of ``block_n`` rows to ``[2, G, 16, block_n / 2]`` (straight from the parts, strided or not), so
    the rows a byte pairs (``j`` and ``j + block_n / 2``) sit at the same place of two planes; the nibbles are
    then paired on 64-bit words written straight into torch's layout.
    """
    orders = list(orders) if orders is not None else [None] * len(parts)
    groups = int(parts[0].shape[1])
    sizes = [int(part.shape[0]) if order is None else int(order.numel())
             for part, order in zip(parts, orders, strict=True)]
    n = sum(sizes)
    k = groups * HALF_SPLIT_GROUP
    full = n // block_n * block_n
    device = parts[0].device
    native = native_repack() if device.type == "cpu" and all(p.stride(-1) == 1 for p in parts) else None
    if any(size % block_n for size in sizes[:-1]):  # a boundary inside a block: one more copy
        parts, orders, sizes = [torch.cat(_in_order(parts, orders))], [None], [n]
    elif native is None or not full:  # torch reads rows in order
        parts, orders = _in_order(parts, orders), [None] * len(parts)
    out = torch.empty(n * k // 2, dtype=torch.uint8, device=device)
    if full and native is not None:  # each part's whole blocks straight into place, in one compiled pass
        start = 0
        for part, order, size in zip(parts, orders, sizes, strict=True):
            whole = min(size, full - start) // block_n * block_n
            if whole:
                target = out[start * k // 2:(start + whole) * k // 2]
                if order is None:
                    native.int4pack_half_split(part[:whole], block_n, target)
                else:
                    native.int4pack_half_split(part, block_n, target, order[:whole])
            start += size
    elif full:
        words = _by_column(parts, n, block_n).view(torch.int64)  # [B, 2, G, 16, block_n / 16]
        packed = out[: full * k // 2].view(full // block_n, groups, 2, 16, block_n // 2).view(torch.int64)
        _pair_nibbles_into(packed[:, :, 0], packed[:, :, 1], words[:, 0], words[:, 1])
    if full < n:  # the last rows (a multiple of 16, all in the last part) pair adjacent rows: [K, T / 2] bytes
        last = parts[-1] if orders[-1] is None else parts[-1].index_select(0, orders[-1][sizes[-1] - (n - full):])
        tail = torch.empty(groups, 16, n - full, dtype=torch.uint8, device=device)
        tail.copy_(last[int(last.shape[0]) - (n - full):].permute(1, 2, 0))
        even, odd = tail[..., 0::2], tail[..., 1::2]
        packed_tail = out[full * k // 2:].view(groups, 2, 16, (n - full) // 2)
        torch.bitwise_or(even & 0x0F, (odd & 0x0F) << 4, out=packed_tail[:, 0])
        torch.bitwise_or(even >> 4, odd & 0xF0, out=packed_tail[:, 1])
    return out.view(n, k // 2)
