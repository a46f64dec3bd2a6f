"""torch's packed int4 CPU layout, byte by byte: which row block this torch uses, packing codes into it, reading
rows back.

torch builds the layout with ``_convert_weight_to_int4pack_for_cpu`` from int32 codes (an int32 copy of every
code first); :func:`pack_codes_bytes` writes the same bytes with byte operations, and :func:`unpack_int4_rows`
reads rows back, once :func:`torch_int4_block_n` has found the layout of this process's torch.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["BLOCK_NS", "pack_codes_bytes", "torch_int4_block_n", "unpack_int4_codes", "unpack_int4_rows"]

BLOCK_NS = (64, 32)
"""The row blocks torch's int4 CPU layout uses: ``4 * Vectorized<float>::size()``, so 64 rows on an
AVX-512 build and CPU, 32 on AVX2 (torch 2.13); which one is read off the op once per process."""


def pack_codes_bytes(codes: torch.Tensor, block_n: int) -> torch.Tensor:
    """torch's CPU int4 layout built with byte operations: the same bytes as
    ``_convert_weight_to_int4pack_for_cpu(codes.int(), 1)`` without its int32 copy of the codes.

    The layout (torch 2.13; which ``block_n`` this process's torch uses is read
    off the op once by :func:`torch_int4_block_n`): output rows in blocks of
    ``block_n`` (64 with AVX-512, 32 with AVX2), each block stored as
    ``[K, block_n / 2]`` bytes whose byte ``(k, j)`` holds row ``j`` in its low
    nibble and row ``j + block_n / 2`` in its high one; the last ``N % block_n``
    rows (a multiple of 16) as ``[K, T / 2]`` bytes pairing adjacent rows. It
    reads the codes input-major, so GPTQ's ``[K, N]`` codes (passed as ``.t()``)
    are never transposed as int32; besides the result it allocates one
    half-size temporary (the op's int32 copy alone is eight times that).
    """
    n, k = (int(s) for s in codes.shape)
    by_input = codes.t().to(torch.uint8)  # [K, N]; a view when the codes were [K, N] uint8
    full = n // block_n * block_n
    out = torch.empty(n * k // 2, dtype=torch.uint8, device=codes.device)
    if full:
        blocks = by_input[:, :full].reshape(k, full // block_n, 2, block_n // 2)
        paired = blocks[:, :, 1] << 4
        paired |= blocks[:, :, 0]
        out[: full * k // 2].view(full // block_n, k, block_n // 2).copy_(paired.permute(1, 0, 2))
        del paired
    if full < n:
        tail = by_input[:, full:]
        paired = tail[:, 1::2] << 4
        paired |= tail[:, 0::2]
        out[full * k // 2:].view(k, (n - full) // 2).copy_(paired)
    return out.view(n, k // 2)


def unpack_int4_rows(data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The uint8 codes ``[len(rows), K]`` of some rows of a weight packed in torch's layout (:func:`pack_codes_bytes`).

    Why: a table kept only packed (an embedding whose head is the int4
    kernel's) looks rows up from the packed bytes instead of a second copy of
    its codes. A row's K bytes lie ``block_n / 2`` apart, so each row read
    touches K / 2 cache lines; indexing the row blocks directly is faster than
    one gather of computed offsets.
    Needs the layout known (:func:`torch_int4_block_n`).
    """
    block_n = torch_int4_block_n()
    if block_n is None:
        raise ValueError("this torch's packed int4 layout is not one loader can read rows back from")
    n, half_k = (int(s) for s in data.shape)
    k = 2 * half_k
    half = block_n // 2
    full = n // block_n * block_n
    flat = data.reshape(-1)
    rows = rows.reshape(-1)
    out = torch.empty(rows.numel(), k, dtype=torch.uint8, device=data.device)
    in_blocks = rows < full
    if bool(in_blocks.any()):  # block b, row j: byte (b, k, j mod half), the high nibble for the second half
        picked = rows[in_blocks]
        blocks = flat[: full * half_k].view(full // block_n, k, half)
        within = picked % block_n
        paired = blocks[torch.div(picked, block_n, rounding_mode="floor"), :, within % half]
        shift = torch.where(within >= half, 4, 0).to(torch.uint8)
        out[in_blocks] = (paired >> shift[:, None]) & 0x0F
    if not bool(in_blocks.all()):  # the tail pairs adjacent rows: byte (k, t / 2), the high nibble for odd t
        picked = rows[~in_blocks] - full
        tail = flat[full * half_k:].view(k, (n - full) // 2)
        paired = tail[:, torch.div(picked, 2, rounding_mode="floor")].t()
        out[~in_blocks] = (paired >> ((picked % 2) * 4).to(torch.uint8)[:, None]) & 0x0F
    return out


def unpack_int4_codes(data: torch.Tensor) -> torch.Tensor:
    """Every row's uint8 codes ``[N, K]`` of a weight packed in torch's layout: the whole-weight form of
    :func:`unpack_int4_rows`, a few byte-wide passes (a dequantize path runs it on every call)."""
    block_n = torch_int4_block_n()
    if block_n is None:
        raise ValueError("this torch's packed int4 layout is not one loader can read rows back from")
    n, half_k = (int(s) for s in data.shape)
    k, half = 2 * half_k, block_n // 2
    full = n // block_n * block_n
    out = torch.empty(n, k, dtype=torch.uint8, device=data.device)
    flat = data.reshape(-1)
    if full:
        blocks = flat[: full * half_k].view(full // block_n, k, half)
        by_row = out[:full].view(full // block_n, 2, half, k)
        by_row[:, 0] = (blocks & 0x0F).transpose(1, 2)
        by_row[:, 1] = (blocks >> 4).transpose(1, 2)
    if full < n:
        tail = flat[full * half_k:].view(k, (n - full) // 2)
        pairs = out[full:].view((n - full) // 2, 2, k)
        pairs[:, 0] = (tail & 0x0F).t()
        pairs[:, 1] = (tail >> 4).t()
    return out


@functools.cache
def torch_int4_block_n() -> int | None:
    """The row block of this torch's int4 CPU layout (:data:`BLOCK_NS`), or ``None`` when neither matches the
    op's bytes (a different torch then packs with its own op, at the cost of an int32 copy of the codes)."""
    generator = torch.Generator().manual_seed(0)
    rows = max(BLOCK_NS) + 16  # whole blocks and a tail for either size
    probe = torch.randint(0, 16, (rows, 64), dtype=torch.int32, generator=generator)
    expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    if expected.dtype != torch.uint8 or expected.shape != (rows, 32):
        return None
    return next((b for b in BLOCK_NS if torch.equal(expected, pack_codes_bytes(probe, b))), None)
