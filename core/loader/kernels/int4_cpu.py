"""torch's packed int4 CPU matmul behind a format-independent interface, with its fallback.

A core building block (``loader.kernels``) rather than part of one plugin, so
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
The bytes are written by :mod:`.int4_layout`.

The kernel takes group sizes 32/64/128/256 and ``N % 16 == 0`` (checked on
torch 2.13); anything else keeps the codes unpacked and dequantizes on every
call — :attr:`Int4CpuWeight.reason` says why. It computes in the activations'
dtype, far faster in bfloat16 than in float32, and orders of magnitude faster
than dequantizing and multiplying in either (benchmarks/RESULTS.md).
"""

from __future__ import annotations

import attrs
import torch

from .int4_layout import pack_codes_bytes, torch_int4_block_n, unpack_int4_codes

__all__ = ["KERNEL_GROUP_SIZES", "Int4CpuWeight", "int4_scales_and_zeros", "int4_unsupported_reason", "pack_int4",
           "pack_int4_codes"]

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

    @property
    def out_features(self) -> int:
        return int(self.data.shape[0])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[N, K]``, ``(q - 8) * scale + zero`` computed in float32, then cast to ``dtype``.

        Packed codes are read back from torch's layout (:func:`~.int4_layout.unpack_int4_codes`, which needs
        the layout known: :func:`~.int4_layout.torch_int4_block_n`); the dequantize path runs this per call.
        """
        if not self.packed:
            sz = self.scales_and_zeros.to(torch.float32).repeat_interleave(self.group_size, 0)  # [K, N, 2]
            return ((self.data.to(torch.float32) - 8) * sz[..., 0].t() + sz[..., 1].t()).to(dtype)
        codes = unpack_int4_codes(self.data)
        n, k = (int(s) for s in codes.shape)
        sz = self.scales_and_zeros.to(torch.float32)
        w = codes.view(n, k // self.group_size, self.group_size).to(torch.float32)
        w.sub_(8).mul_(sz[..., 0].t().unsqueeze(-1)).add_(sz[..., 1].t().unsqueeze(-1))
        return w.view(n, k).to(dtype)

    def rows(self, start: int, stop: int) -> Int4CpuWeight:
        """Output rows ``[start, stop)`` (the codes a view, the scales a small copy: the kernel reads them
        contiguous; ``start`` and ``stop`` on the layout's row blocks, multiples of 64, or ``stop`` the last row)."""
        return attrs.evolve(self, data=self.data[start:stop],
                            scales_and_zeros=self.scales_and_zeros[:, start:stop].contiguous())

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
    return pack_int4_codes(codes, int4_scales_and_zeros(scales, biases, dtype), group_size)


def int4_scales_and_zeros(scales: torch.Tensor, biases: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``[groups, N, 2]`` in ``dtype``, torch's convention: ``zero = bias + 8 scale``, computed in float32."""
    s = scales.to(torch.float32)
    return torch.stack([s, biases.to(torch.float32) + 8 * s], dim=-1).to(dtype).contiguous()


def pack_int4_codes(codes: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int) -> Int4CpuWeight:
    """:func:`pack_int4` for scales already in torch's form (:func:`int4_scales_and_zeros`): codes ``[N, K]``
    in torch's layout (or kept unpacked, with the reason) beside their scales and zeros."""
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
