"""CPU int8 weights: channelwise on torch's int8 kernel, and a scale per 32 input columns on its int4 kernel.

Channelwise (:func:`pack_int8`, Marlin's 8-bit GPTQ/AWQ): torch's int8 weight
kernel (``_weight_int8pack_mm``) multiplies by int8 codes ``[N, K]`` with one
scale per output channel. An affine channelwise weight ``w = code * scale +
bias`` (``bias = -zero * scale``) is rewritten as ``(code - 128) * scale +
(128 * scale + bias)``; the constant per-channel term is added as ``sum(x) *
offset``, so asymmetric weights run too. Grouped 8-bit weights (several
scales along K) do not fit it (:func:`int8_unsupported_reason`).

Grouped by 32 columns (:func:`pack_int8_grouped`, GGUF Q8_0): two nibble
planes of the int4 kernel. Why: the int8 kernel takes one scale per output
row, so a weight whose scale changes every 32 input columns (GGUF
Q8_0) needs one call per 32 columns, and a call over 32 columns costs nearly
what one over whole rows does (a tied Q8_0 head took a fifth of a decode step:
benchmarks/RESULTS.md). The int4 kernel takes a
scale and a zero per group of 32 columns, and a code's two nibbles are two
4-bit weights (``h = (c >> 4) + 8``, ``l = c & 15``, arithmetic shift)::

    c * s = (h - 8) * 16s  +  (l - 8) * s + 8s

— torch's ``(q - 8) * scale + zero`` with scale ``16s``, zero 0 for the high
plane and scale ``s``, zero ``8s`` for the low one. Stacked as one weight of
``2 N`` rows, one kernel call computes both halves; they are added in float32.

Exactness: the kernel widens the scale and zero (rounded to its dtype once, at
packing) to float32 and computes ``(q - 8) * scale + zero`` there; a 4-bit code
times a bfloat16 scale (8 significant bits) is exact in float32, so the weight
multiplied is ``c * s`` with ``s`` rounded to the kernel dtype — what the int8
kernel multiplies too. Each half's sums are rounded to the kernel dtype once
(``tests/core/test_kernels_int8_cpu.py`` bounds every output by that).

The codes stay readable: :meth:`Int8GroupedWeight.codes` rebuilds any rows'
int8 codes from the two planes, so an embedding table kept this way looks its
rows up exactly without a second copy of the codes.
"""

from __future__ import annotations

import attrs
import torch

from .int4_cpu import Int4CpuWeight, int4_unsupported_reason
from .int4_layout import pack_codes_bytes, torch_int4_block_n, unpack_int4_codes, unpack_int4_rows
from .native_packing import native_repack

__all__ = ["GROUP", "Int8CpuWeight", "Int8GroupedWeight", "int8_grouped_unsupported_reason",
           "int8_unsupported_reason", "pack_int8", "pack_int8_grouped"]

GROUP = 32
"""Input columns sharing one scale (GGUF Q8_0's block)."""

_LOW_NIBBLES = 0x0F0F0F0F0F0F0F0F
_HIGH_NIBBLES = -0x0F0F0F0F0F0F0F10  # 0xF0F0F0F0F0F0F0F0 as a signed 64-bit value
_EIGHTS = -0x7777777777777778  # 0x8888888888888888: h = (c >> 4) + 8 is the high nibble with its top bit flipped


def int8_grouped_unsupported_reason(out_features: int, in_features: int) -> str | None:
    """Why an int8 weight with a scale per 32 columns cannot run as two int4 planes here, or ``None``."""
    if torch_int4_block_n() is None:
        return "this torch's packed int4 layout is not one loader can read rows back from"
    return int4_unsupported_reason(out_features, in_features, GROUP)


@attrs.frozen(eq=False)
class Int8GroupedWeight:
    """An int8 weight ``[N, K]`` (scale per 32 columns) as torch's int4 weight of ``2 N`` rows: high nibbles, then low.

    :ivar planes: the stacked planes (``planes.scales_and_zeros`` ``[K / 32, 2 N, 2]`` in the kernel dtype).
    :ivar out_features: ``N``.
    """

    planes: Int4CpuWeight
    out_features: int

    @property
    def in_features(self) -> int:
        return self.planes.in_features

    @property
    def kernel_dtype(self) -> torch.dtype:
        """The dtype the kernel computes in (activations are cast to it); results are float32."""
        return self.planes.kernel_dtype

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ (codes * scales).T`` in float32 for ``x [..., K]`` in the kernel dtype (each half rounded to it)."""
        both = self.planes.matmul(x)
        n = self.out_features
        return both[..., :n].to(torch.float32) + both[..., n:]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[N, K]``: codes read back from the planes times the low plane's scales (the kernel dtype's
        rounding of them), in float32, then cast to ``dtype``."""
        n, k = self.out_features, self.in_features
        both = unpack_int4_codes(self.planes.data).to(torch.int16)  # every row of both planes, one pass
        codes = ((both[:n] - 8) * 16 + both[n:]).to(torch.float32)
        scales = self.planes.scales_and_zeros[:, n:, 0].to(torch.float32).t()  # [N, K / 32]
        return (codes.view(n, k // GROUP, GROUP) * scales.unsqueeze(-1)).view(n, k).to(dtype)

    def rows(self, start: int, stop: int) -> Int8GroupedWeight:
        """Output rows ``[start, stop)`` of both planes (a copy: the planes' rows are ``N`` apart; ``start`` and
        ``stop`` on the layout's row blocks, or ``stop`` the last row)."""
        n, planes = self.out_features, self.planes
        if (start, stop) == (0, n):
            return self
        if n % 64:
            raise ValueError(f"rows of grouped int8 planes over {n} rows (not whole blocks of 64) cannot be sliced")
        data = torch.cat((planes.data[start:stop], planes.data[n + start:n + stop]))
        sz = torch.cat((planes.scales_and_zeros[:, start:stop], planes.scales_and_zeros[:, n + start:n + stop]),
                       dim=1)
        return Int8GroupedWeight(attrs.evolve(planes, data=data, scales_and_zeros=sz), stop - start)

    def codes(self, rows: torch.Tensor) -> torch.Tensor:
        """The int8 codes ``[len(rows), K]`` of these rows, read back from the planes (exact)."""
        flat = rows.reshape(-1)
        both = unpack_int4_rows(self.planes.data, torch.cat((flat, flat + self.out_features))).to(torch.int16)
        high, low = both[: flat.numel()], both[flat.numel():]
        return ((high - 8) * 16 + low).to(torch.int8)


def pack_int8_grouped(codes: torch.Tensor, scales: torch.Tensor,
                      dtype: torch.dtype = torch.bfloat16) -> Int8GroupedWeight:
    """Split int8 codes into the two int4 planes torch's kernel multiplies.

    :param codes: int8 (or their uint8 bytes) ``[N, K / 32, 32]``, any strides — e.g. a view of GGUF
        Q8_0 blocks past their scale.
    :param scales: ``[K / 32, N]``: ``w[n, k] = codes[n, k] * scales[k // 32, n]``.
    :param dtype: the kernel's (and activations') dtype, bfloat16 or float16; the scales are rounded to it.
    :raises ValueError: shapes that disagree, or a weight :func:`int8_grouped_unsupported_reason` refuses.
    """
    n, groups, group = (int(s) for s in codes.shape)
    if group != GROUP or tuple(scales.shape) != (groups, n):
        raise ValueError(f"int8 codes {tuple(codes.shape)} and scales {tuple(scales.shape)} do not describe "
                         f"groups of {GROUP} input columns")
    reason = int8_grouped_unsupported_reason(n, groups * GROUP)
    if reason is not None:
        raise ValueError(reason)
    wide = scales.to(torch.float32)
    scales_and_zeros = torch.empty(groups, 2 * n, 2, dtype=dtype, device=codes.device)
    scales_and_zeros[:, :n, 0] = wide * 16  # scaling by a power of two commutes with the rounding to dtype
    scales_and_zeros[:, :n, 1] = 0
    scales_and_zeros[:, n:, 0] = wide
    scales_and_zeros[:, n:, 1] = wide * 8
    block_n = torch_int4_block_n()
    assert block_n is not None  # int8_grouped_unsupported_reason said so
    data = _nibble_planes(codes.view(torch.uint8), block_n)
    return Int8GroupedWeight(Int4CpuWeight(data, scales_and_zeros, GROUP, groups * GROUP), n)


def _nibble_planes(codes: torch.Tensor, block_n: int) -> torch.Tensor:
    """torch's int4 layout ``[2 N, K / 2]`` of the high-nibble plane stacked over the low one.

    With whole row blocks the compiled helpers (:mod:`loader.kernels.native_packing`) write both planes in one
    pass; without them one byte-level copy transposes each block to ``[2, K, block_n / 2]`` (its two
    halves of rows, the ones a byte of the layout pairs, in two planes) and eight word-wide operations write
    both planes' bytes; otherwise both planes are widened to one code per byte and packed as any codes.
    """
    n, groups, group = (int(s) for s in codes.shape)
    k = groups * group
    if n % block_n:
        flat = codes.reshape(n, k)
        stacked = torch.empty(2 * n, k, dtype=torch.uint8, device=codes.device)
        torch.bitwise_right_shift(flat, 4, out=stacked[:n])
        stacked[:n] ^= 8
        torch.bitwise_and(flat, 15, out=stacked[n:])
        return pack_codes_bytes(stacked, block_n)
    native = native_repack() if codes.device.type == "cpu" and codes.stride(-1) == 1 else None
    if native is not None:
        planes = torch.empty(2 * n * k // 2, dtype=torch.uint8)
        native.int8_planes(codes, block_n, planes)
        return planes.view(2 * n, k // 2)
    blocks, half = n // block_n, block_n // 2
    by_column = torch.empty(blocks, 2, groups, group, half, dtype=torch.uint8, device=codes.device)
    by_column.copy_(codes.view(blocks, 2, half, groups, group).permute(0, 1, 3, 4, 2))
    words = by_column.view(blocks, 2, k, half).view(torch.int64)
    first, second = words[:, 0], words[:, 1]  # rows j and j + block_n / 2 of each block, [B, K, half / 8]
    out = torch.empty(2 * n * k // 2, dtype=torch.uint8, device=codes.device)
    high = out[: n * k // 2].view(blocks, k, half).view(torch.int64)
    low = out[n * k // 2:].view(blocks, k, half).view(torch.int64)
    torch.bitwise_right_shift(first, 4, out=high)
    high &= _LOW_NIBBLES
    scratch = second & _HIGH_NIBBLES
    high |= scratch
    high ^= _EIGHTS
    torch.bitwise_and(first, _LOW_NIBBLES, out=low)
    torch.bitwise_left_shift(second, 4, out=scratch)
    scratch &= _HIGH_NIBBLES
    low |= scratch
    return out.view(2 * n, k // 2)


def int8_unsupported_reason(groups: int) -> str | None:
    """Why torch's int8 kernel cannot take an 8-bit weight of ``groups`` scale groups along K, or ``None``."""
    if groups != 1:
        return f"8-bit with {groups} groups: the int8 kernel takes one scale per output channel"
    return None


@attrs.frozen(eq=False)
class Int8CpuWeight:
    """A channelwise 8-bit weight for ``_weight_int8pack_mm``.

    :ivar codes: int8 ``[N, K]``, ``code - 128``.
    :ivar scales: ``[N]``.
    :ivar offsets: ``[N]`` added per unit of input sum, or ``None`` when symmetric.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` for ``x [..., K]`` in x's dtype."""
        flat = x.reshape(-1, self.codes.shape[1]).contiguous()
        scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.codes, scales)
        if self.offsets is not None:
            out = out + flat.sum(-1, keepdim=True) * self.offsets.to(x.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[1])

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def kernel_dtype(self) -> torch.dtype:
        """The dtype of the kept scales (the kernel takes activations of any float dtype)."""
        return self.scales.dtype

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[N, K]``: ``code * scale + offset``, in float32, then cast to ``dtype``."""
        w = self.codes.to(torch.float32) * self.scales.to(torch.float32).unsqueeze(-1)
        if self.offsets is not None:
            w += self.offsets.to(torch.float32).unsqueeze(-1)
        return w.to(dtype)

    def rows(self, start: int, stop: int) -> Int8CpuWeight:
        """Output rows ``[start, stop)``."""
        offsets = None if self.offsets is None else self.offsets[start:stop]
        return Int8CpuWeight(self.codes[start:stop], self.scales[start:stop], offsets)


def pack_int8(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> Int8CpuWeight:
    """Channelwise ``w[n, k] = (codes[n, k] - zeros[n]) * scales[n]`` (codes in ``[0, 256)``) for the kernel."""
    s = scales.to(torch.float32)
    offsets = (128 - zeros.to(torch.float32)) * s
    symmetric = bool((zeros == 128).all())
    return Int8CpuWeight(
        codes=(codes.to(torch.int16) - 128).to(torch.int8).contiguous(), scales=s.to(dtype),
        offsets=None if symmetric else offsets.to(dtype),
    )
