"""CPU kernels for 8-bit weights with a scale per group of input rows (W8A16 with groups), and the choice.

torch's int8 weight kernel (``_weight_int8pack_mm``) takes one scale per output row, so a grouped weight needs
another form. Two keep one byte per weight and the exact codes:

* ``int8groups`` (:class:`Int8GroupsKernel`): one ``_weight_int8pack_mm`` per group over its rows, the partial
  products summed in float32. Any group size; the call count grows with ``K / group``.
* ``int8planes`` (:class:`Int8PlanesKernel`): the core's two int4 planes (:func:`~loader.kernels.pack_int8_grouped`),
  each group's scale repeated over its 32-row blocks; one kernel call, groups that are multiples of 32.

Which is faster depends on the group size. Measured (``benchmarks/bench_int8_kernels.py --group G``, K=2048,
N=8192, OMP_NUM_THREADS=2, a fresh process per kernel, five interleaved rounds, medians, M=1 / M=128 ms):
group 128: groups 1.2 / 48, planes 2.7 / 61, the bfloat16 weight dequantized once 2.4 / 11 (two bytes per
weight), dequantize per call (the old fallback) 113 / 300. Group 32: groups 4.3 / 535, planes 1.5 / 111,
dequantized once 3.2 / 24, per call 170 / 250 (absolute times drift with the shared machine's load; the
rounds are interleaved so each comparison sees the same load). Group 64: groups 2.2 / 296, planes 8.0 / 132 —
a 128-token prompt and 128 generated tokens cost 578 ms one way and 1156 the other. So groups of
:data:`GROUPS_MIN_ROWS` rows or more (and any size the planes cannot take) run as ``int8groups``, groups of 32 as
``int8planes``.

Asymmetric weights: ``(code - zero) * scale = (code - 128) * scale + (128 - zero) * scale``; the second term
is added as each group's input sum times it. Both compute in bfloat16 or float16: a float32 load keeps its
exact float32 fallback rather than rounding every activation to 8 significant bits. Act-order (rows of a
group scattered) is left to the fallback.
"""

from __future__ import annotations

import attrs
import torch

from loader.kernels import (
    Int4CpuWeight,
    Int8GroupedWeight,
    KernelChoice,
    TokenPlan,
    int8_grouped_unsupported_reason,
    pack_int8_grouped,
    run_planned,
)

from .quantized_weight import QuantizedWeight

__all__ = ["GROUPS_MIN_ROWS", "PLANES_GROUP", "GroupedPathWeight", "Int8GroupsKernel", "Int8PlanesKernel",
           "grouped_int8_kernel", "pack_grouped_int8"]

PLANES_GROUP = 32
"""Input rows per scale of the int8 planes (the core's int4 kernel group)."""
GROUPS_MIN_ROWS = 64
"""From this group size on, one int8 call per group beats the planes over a prompt and its generation (measured
at 32, 64 and 128)."""
_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


def _offset_terms(x: torch.Tensor, offsets: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """Each ``rows``-row block's input sum times its ``(128 - zero) * scale`` row (``None``: symmetric)."""
    if offsets is None:
        return None
    return x.to(torch.float32).unflatten(-1, (-1, rows)).sum(-1) @ offsets


@attrs.frozen(eq=False)
class Int8PlanesKernel:
    """A grouped 8-bit weight as the core's two int4 planes (a scale per 32 input rows, group scales repeated).

    :ivar offsets: ``[K / 32, N]`` float32 ``(128 - zero) * scale`` per 32-row block, or ``None`` when symmetric.
    :ivar plans: the path per activation dtype and tokens (:mod:`~loader_plugin_marlin.kernel_paths`).
    :ivar dense: the dequantized weight, kept when the plan runs the ``dense`` path.
    """

    planes: Int4CpuWeight
    out_features: int
    offsets: torch.Tensor | None
    choice: KernelChoice
    plans: tuple[TokenPlan, ...] = ()
    dense: torch.Tensor | None = None

    def packed_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The planes' kernel on ``x`` cast to its dtype, the offsets' terms added; in ``x``'s dtype."""
        weight = Int8GroupedWeight(self.planes, self.out_features)  # a view: the layer's buffers are the planes'
        out = weight.matmul(x.to(weight.kernel_dtype))
        extra = _offset_terms(x, self.offsets, PLANES_GROUP)
        return (out if extra is None else out + extra).to(x.dtype)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        weight = Int8GroupedWeight(self.planes, self.out_features).dequantize(torch.float32)
        if self.offsets is not None:
            weight = (weight.unflatten(-1, (-1, PLANES_GROUP)) + self.offsets.t().unsqueeze(-1)).flatten(-2)
        return weight.to(dtype)

    def rows(self, start: int, stop: int) -> Int8PlanesKernel:
        planes = Int8GroupedWeight(self.planes, self.out_features).rows(start, stop).planes
        offsets = None if self.offsets is None else self.offsets[:, start:stop]
        return Int8PlanesKernel(planes, stop - start, offsets, self.choice)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return run_planned(GroupedPathWeight(self), self.plans, x, self.dense)


@attrs.frozen(eq=False)
class Int8GroupsKernel:
    """One ``_weight_int8pack_mm`` per group of input rows, summed in float32.

    :ivar codes: int8 ``[G, N, group]`` (``code - 128``), each group's rows contiguous.
    :ivar scales: ``[G, N]`` in the kernel dtype.
    :ivar offsets: ``[G, N]`` float32 ``(128 - zero) * scale``, or ``None`` when symmetric.
    :ivar plans: the path per activation dtype and tokens (:mod:`~loader_plugin_marlin.kernel_paths`).
    :ivar dense: the dequantized weight, kept when the plan runs the ``dense`` path.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None
    choice: KernelChoice
    plans: tuple[TokenPlan, ...] = ()
    dense: torch.Tensor | None = None

    def packed_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """One int8 kernel call per group on ``x`` cast to the kernel dtype, summed in float32; in ``x``'s dtype."""
        groups, n, rows = (int(s) for s in self.codes.shape)
        flat = x.reshape(-1, groups * rows)
        by_group = flat.to(self.scales.dtype).unflatten(-1, (groups, rows)).transpose(0, 1).contiguous()
        out = torch.zeros(flat.shape[0], n, dtype=torch.float32, device=x.device)
        for group in range(groups):
            out += torch.ops.aten._weight_int8pack_mm(by_group[group], self.codes[group], self.scales[group])
        extra = _offset_terms(flat, self.offsets, rows)
        out = out if extra is None else out + extra
        return out.to(x.dtype).reshape(*x.shape[:-1], n)

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        weight = self.codes.to(torch.float32) * self.scales.to(torch.float32).unsqueeze(-1)  # [G, N, rows]
        if self.offsets is not None:
            weight += self.offsets.unsqueeze(-1)
        return weight.permute(1, 0, 2).reshape(self.codes.shape[1], -1).to(dtype)

    def rows(self, start: int, stop: int) -> Int8GroupsKernel:
        offsets = None if self.offsets is None else self.offsets[:, start:stop]
        # copies: the int8 kernel reads each group's codes as one contiguous block (a strided slice is far slower)
        return Int8GroupsKernel(self.codes[:, start:stop].contiguous(), self.scales[:, start:stop].contiguous(),
                                None if offsets is None else offsets.contiguous(), self.choice)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return run_planned(GroupedPathWeight(self), self.plans, x, self.dense)


@attrs.frozen(eq=False)
class GroupedPathWeight:
    """A grouped kernel as the core's paths see a weight (:class:`~loader.kernels.PathWeight`): its packed call,
    dequantization and rows; the kernel computes in its scales' dtype."""

    kernel: Int8PlanesKernel | Int8GroupsKernel

    @property
    def kernel_dtype(self) -> torch.dtype:
        kernel = self.kernel
        return kernel.planes.kernel_dtype if isinstance(kernel, Int8PlanesKernel) else kernel.scales.dtype

    @property
    def in_features(self) -> int:
        kernel = self.kernel
        if isinstance(kernel, Int8PlanesKernel):
            return kernel.planes.in_features
        return int(kernel.codes.shape[0] * kernel.codes.shape[2])

    @property
    def out_features(self) -> int:
        kernel = self.kernel
        return kernel.out_features if isinstance(kernel, Int8PlanesKernel) else int(kernel.codes.shape[1])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.packed_matmul(x)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return self.kernel.dequantize(dtype)

    def rows(self, start: int, stop: int) -> GroupedPathWeight:
        return GroupedPathWeight(self.kernel.rows(start, stop))


def grouped_int8_kernel(out_features: int, in_features: int, group_size: int, act_order: bool,
                        dtype: torch.dtype) -> str | None:
    """``int8groups`` or ``int8planes`` for a grouped 8-bit weight of this shape, or ``None`` (the fallback)."""
    if dtype not in _KERNEL_DTYPES or act_order or group_size <= 0 or in_features % group_size:
        return None
    planes = group_size % PLANES_GROUP == 0 and int8_grouped_unsupported_reason(out_features, in_features) is None
    return "int8planes" if planes and group_size < GROUPS_MIN_ROWS else "int8groups"


def pack_grouped_int8(weight: QuantizedWeight, dtype: torch.dtype) -> Int8PlanesKernel | Int8GroupsKernel | None:
    """The grouped kernel :func:`grouped_int8_kernel` names for ``weight``, packed; ``None`` when none fits."""
    kind = grouped_int8_kernel(weight.out_features, weight.in_features, weight.group_size, weight.act_order, dtype)
    if kind is None:
        return None
    rows = PLANES_GROUP if kind == "int8planes" else weight.group_size
    blocks = weight.g_idx[::rows].long()
    scales = weight.scales[blocks].to(torch.float32)
    offsets = None if weight.is_symmetric() else (128 - weight.zeros[blocks].to(torch.float32)) * scales
    signed = (weight.codes.t().to(torch.int16) - 128).to(torch.int8).reshape(weight.out_features, -1, rows)
    if kind == "int8planes":
        planes = pack_int8_grouped(signed, scales, dtype)
        return Int8PlanesKernel(planes.planes, weight.out_features, offsets, KernelChoice(kind))
    return Int8GroupsKernel(signed.transpose(0, 1).contiguous(), scales.to(dtype), offsets, KernelChoice(kind))
