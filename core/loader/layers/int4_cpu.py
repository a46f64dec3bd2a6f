"""torch's packed int4 CPU matmul behind a format-independent interface, with its fallback.

A core building block (``loader.layers``) rather than part of one plugin, so
every 4-bit format plugin (Marlin's GPTQ/AWQ, GGUF) packs with the same code
without depending on another plugin.

Any 4-bit format whose weight is affine per group — ``w[n, k] = code[n, k] *
scale[g, n] + bias[g, n]`` for the ``group_size`` consecutive input columns
``k`` of group ``g`` — can run here: GPTQ/AWQ (``bias = -zero * scale``),
GGUF Q4_0 (``bias = -8 * d``) and Q4_1 (``bias = m``). :func:`pack_int4`
converts such a weight into torch's layout
(``_convert_weight_to_int4pack_for_cpu``: uint8 ``[N, K/2]``; scales and
zeros ``[K/group, N, 2]`` with torch's convention ``w = (q - 8) * scale +
zero``), and :meth:`Int4CpuWeight.matmul` runs ``_weight_int4pack_mm_for_cpu``.

The kernel takes group sizes 32/64/128/256 and ``N % 16 == 0`` (checked on
torch 2.13); anything else keeps the codes unpacked and dequantizes on every
call — :attr:`Int4CpuWeight.reason` says why. It computes in the activations'
dtype; on a 2-core machine, N = K = 4096, one token: 2.2 ms in bfloat16, 196
ms in float32, against 1.8 s / 3.3 s to dequantize and multiply.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
import torch

from .native_packing import native_repack

__all__ = ["KERNEL_GROUP_SIZES", "Int4CpuWeight", "int4_unsupported_reason", "pack_codes_bytes", "pack_int4",
           "pack_int4_half_split", "pack_int4_half_split_parts", "packed_layout_fingerprint", "torch_int4_block_n",
           "unpack_int4_rows"]

KERNEL_GROUP_SIZES = (32, 64, 128, 256)
_N_MULTIPLE = 16


def int4_unsupported_reason(out_features: int, in_features: int, group_size: int) -> str | None:
    """Why torch's packed int4 kernel cannot take this weight, or ``None`` when it can."""
    if group_size not in KERNEL_GROUP_SIZES:
        return f"group size {group_size} is not one of the int4 kernel's {list(KERNEL_GROUP_SIZES)}"
    if in_features % group_size:
        return f"input features {in_features} are not a multiple of the group size {group_size}"
    if out_features % _N_MULTIPLE:
        return f"output features {out_features} are not a multiple of {_N_MULTIPLE}"
    return None


@attrs.frozen(eq=False)
class Int4CpuWeight:
    """One weight ready for CPU matmuls: packed for torch's kernel, or unpacked codes with :attr:`reason`.

    :ivar data: uint8 ``[N, K/2]`` packed by torch, or uint8 codes ``[N, K]`` when unpacked.
    :ivar scales_and_zeros: ``[K/group, N, 2]`` in torch's convention (``w = (q - 8) * s + z``).
    :ivar group_size: input columns per group.
    :ivar reason: why the packed kernel is not used (``None`` when it is).
    """

    data: torch.Tensor
    scales_and_zeros: torch.Tensor
    group_size: int
    in_features: int
    reason: str | None = None

    @property
    def packed(self) -> bool:
        return self.reason is None

    @property
    def kernel_dtype(self) -> torch.dtype:
        """The dtype the kernel computes in: its scales' (activations are cast to it)."""
        return self.scales_and_zeros.dtype

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[N, K]`` (only for unpacked codes: torch's packed layout is opaque)."""
        if self.packed:
            raise ValueError("the packed int4 layout cannot be dequantized; keep the source codes for that")
        sz = self.scales_and_zeros.to(torch.float32).repeat_interleave(self.group_size, 0)  # [K, N, 2]
        w = (self.data.to(torch.float32) - 8) * sz[..., 0].t() + sz[..., 1].t()
        return w.to(dtype)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` for ``x [..., K]`` in x's dtype (bfloat16, float16 or float32)."""
        if not self.packed:
            return torch.nn.functional.linear(x, self.dequantize(x.dtype))
        flat = x.reshape(-1, self.in_features)
        sz = self.scales_and_zeros if self.scales_and_zeros.dtype == x.dtype else self.scales_and_zeros.to(x.dtype)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat.contiguous(), self.data, self.group_size, sz)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def pack_int4(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int,
              dtype: torch.dtype = torch.bfloat16) -> Int4CpuWeight:
    """Pack an affine 4-bit weight for torch's CPU kernel (or keep it unpacked, with the reason).

    :param codes: ``[N, K]`` integers in ``[0, 16)``.
    :param scales: ``[K / group_size, N]``.
    :param biases: ``[K / group_size, N]``: ``w = code * scale + bias``.
    :param group_size: consecutive input columns per group; ``K`` must be a multiple of it.
    :param dtype: the dtype of the scales the kernel reads (the activations' dtype).
    """
    n, k = (int(s) for s in codes.shape)
    if k % group_size or scales.shape != (k // group_size, n) or biases.shape != scales.shape:
        raise ValueError(f"codes {tuple(codes.shape)}, scales {tuple(scales.shape)} and biases "
                         f"{tuple(biases.shape)} do not describe groups of {group_size} input columns")
    return _pack_codes(codes, _scales_and_zeros(scales, biases, dtype), group_size)


def _scales_and_zeros(scales: torch.Tensor, biases: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[groups, N, 2]`` in ``dtype``, torch's convention: ``zero = bias + 8 scale``, computed in float32."""
    s = scales.to(torch.float32)
    return torch.stack([s, biases.to(torch.float32) + 8 * s], dim=-1).to(dtype).contiguous()


def _pack_codes(codes: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int) -> Int4CpuWeight:
    """Codes ``[N, K]`` in torch's layout (or kept unpacked, with the reason) beside their scales and zeros."""
    n, k = (int(s) for s in codes.shape)
    reason = int4_unsupported_reason(n, k, group_size)
    if reason is not None:
        return Int4CpuWeight(codes.to(torch.uint8).contiguous(), scales_and_zeros, group_size, k, reason)
    block_n = torch_int4_block_n()
    if block_n is not None:
        data = pack_codes_bytes(codes, block_n)
    else:
        data = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    return Int4CpuWeight(data, scales_and_zeros, group_size, k, None)


_BLOCK_NS = (64, 32)
"""The row blocks torch's int4 CPU layout uses: ``4 * Vectorized<float>::size()``, so 64 rows on an
AVX-512 build and CPU, 32 on AVX2 (torch 2.13); which one is read off the op once per process."""
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
    unpacked codes (``tests/core/test_layers_int4_cpu.py``).
    """
    n, groups, half = (int(s) for s in qs.shape)
    if half != HALF_SPLIT_GROUP // 2:
        raise ValueError(f"half-split codes {tuple(qs.shape)} do not hold groups of {HALF_SPLIT_GROUP} columns")
    if scales.shape != (groups, n) or biases.shape != scales.shape:
        raise ValueError(f"scales {tuple(scales.shape)} and biases {tuple(biases.shape)} do not match "
                         f"half-split codes {tuple(qs.shape)}")
    return pack_int4_half_split_parts([qs], _scales_and_zeros(scales, biases, dtype))


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
        return _pack_codes(torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, k), scales_and_zeros, HALF_SPLIT_GROUP)
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
    the nibble pairing runs over long contiguous words (interleaved halves were 4-word runs, ~3x slower).
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
    """:func:`pack_codes_bytes`'s layout (see there) from half-split codes ``[N_i, G, 16]``, rows in parts.

    Parts whose boundaries fall inside a row block are concatenated first. With the compiled helpers
    (:mod:`loader.layers.native_packing`) each part's whole blocks are packed in one pass; otherwise one
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
    touches K / 2 cache lines (~2.5 us a row on a 2-core Xeon); indexing the
    row blocks directly was ~1.8x faster than one gather of computed offsets.
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


@functools.cache
def torch_int4_block_n() -> int | None:
    """The row block of this torch's int4 CPU layout (:data:`_BLOCK_NS`), or ``None`` when neither matches the
    op's bytes (a different torch then packs with its own op, at the cost of an int32 copy of the codes)."""
    generator = torch.Generator().manual_seed(0)
    rows = max(_BLOCK_NS) + 16  # whole blocks and a tail for either size
    probe = torch.randint(0, 16, (rows, 64), dtype=torch.int32, generator=generator)
    expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    if expected.dtype != torch.uint8 or expected.shape != (rows, 32):
        return None
    return next((b for b in _BLOCK_NS if torch.equal(expected, pack_codes_bytes(probe, b))), None)


@functools.cache
def packed_layout_fingerprint() -> str:
    """A digest of everything that decides the bytes this core's packers write for a given input: torch's
    version, its int4 row block (:func:`torch_int4_block_n`), the CPU capability torch dispatches to, and the
    packing code itself (this module, :mod:`.int8_cpu`, and :mod:`.native_packing` with its C source).

    Why: a plugin that keeps packed weights on disk between loads (GGUF's packed-weights bundle) keys them by
    it, so another torch, another CPU or an edited packer makes a miss instead of loading bytes laid out for
    something else. Computed once a process (~1 ms: the sources are read and hashed).
    """
    import hashlib
    from pathlib import Path

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in ("int4_cpu.py", "int8_cpu.py", "native_packing.py", "native_packing.c"):
        digest.update(name.encode() + b"\0" + (here / name).read_bytes())
    for part in (torch.__version__, str(torch_int4_block_n()), torch.backends.cpu.get_cpu_capability()):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()
