"""Choose, per layer, how a :class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight` is multiplied.

On the CPU: torch's packed int4 kernel for 4-bit weights, its int8 kernel
for channelwise 8-bit ones, and dequantize-then-matmul (the reference) for
what neither takes. The packed kernels beat dequantize + matmul by orders of
magnitude in both bfloat16 and float32 (benchmarks/RESULTS.md), so ``auto``
takes them whenever the layer fits and records why when it does not.

Act-order does not force the fallback: sorting the input rows by ``g_idx``
makes every group contiguous (Marlin does the same), and the activations are
gathered in that order before the matmul. A partial last group (GPTQModel
writes group 128 over K = 576) does not either: the kernel's group may be any
of 32-256 that tiles both the checkpoint's groups and K, with scales repeated.
Where none does (a rank's share of act-order rows under tensor parallelism,
groups of 16), each group is padded to whole kernel groups of 32 with rows
that read an appended zero input, at the cost of the padding's extra columns.

Grouped 8-bit weights (W8A16 with groups) take one of the grouped int8 kernels
on bfloat16/float16 loads (:mod:`~loader_plugin_marlin.grouped_int8_kernels`:
one int8 call per group, or two int4 planes, chosen by group size as measured
there); float32 loads keep the exact fallback.

The kernels themselves and the choice between them are the core's
(:mod:`loader.kernels`): this module states which kernel a layer could take
and why not (:func:`wanted_kernel`, then the shapes), the core's chooser picks, and the
layer records the :class:`~loader.kernels.KernelChoice`.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import torch

from loader.kernels import (
    KERNEL_GROUP_SIZES,
    Int4CpuWeight,
    Int8CpuWeight,
    KernelChoice,
    KernelOption,
    TokenPlan,
    int4_unsupported_reason,
    int8_unsupported_reason,
    pack_int4,
    pack_int8,
    run_planned,
)
from loader.kernels import choose_kernel as choose_from
from loader.models import current_session

from .grouped_int8_kernels import Int8GroupsKernel, Int8PlanesKernel, grouped_int8_kernel, pack_grouped_int8
from .layer_geometry import LayerGeometry
from .marlin_cuda import marlin_cuda_unavailable_reason, marlin_kernel
from .marlin_layout import marlin_shape_reason, marlin_unsupported_reason, repack
from .quantized_weight import QuantizedWeight, default_g_idx

__all__ = ["FALLBACK", "DequantizeKernel", "Int4Kernel", "Int8Kernel", "LayerKernel", "choose_kernel", "kernel_group",
           "plan_kernel", "wanted_kernel"]

FALLBACK = "dequantize"
_REQUESTED_FALLBACK = KernelChoice(FALLBACK, "quantization_options kernel='dequantize'")


class LayerKernel(Protocol):
    """What a layer calls: the matmul, and the choice to report."""

    @property
    def choice(self) -> KernelChoice: ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor: ...


@attrs.frozen(eq=False)
class DequantizeKernel:
    """The reference: dequantize the whole weight on every call, then ``F.linear``."""

    weight: QuantizedWeight
    choice: KernelChoice

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x, self.weight.dequantize(x.dtype))


@attrs.frozen(eq=False)
class Int4Kernel:
    """torch's packed int4 matmul, activations gathered into the kernel's row order first when needed.

    :ivar in_perm: for each kernel row, the input feature it reads (``g_idx``
        order for act-order), or ``None`` when rows are in input order.
    :ivar padded: whether ``in_perm`` also points at an appended zero feature
        (rows added so every group fills whole kernel groups).
    """

    packed: Int4CpuWeight
    in_perm: torch.Tensor | None
    choice: KernelChoice
    padded: bool = False
    plans: tuple[TokenPlan, ...] = ()
    dense: torch.Tensor | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """The planned path (:mod:`~loader_plugin_marlin.kernel_paths`) for ``x``'s dtype and token count."""
        if self.padded:
            x = torch.nn.functional.pad(x, (0, 1))
        if self.in_perm is not None:
            x = x.index_select(-1, self.in_perm)
        return run_planned(self.packed, self.plans, x, self.dense)


@attrs.frozen(eq=False)
class Int8Kernel:
    """torch's int8 weight kernel for a channelwise 8-bit weight, along the planned path."""

    packed: Int8CpuWeight
    choice: KernelChoice
    plans: tuple[TokenPlan, ...] = ()
    dense: torch.Tensor | None = None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        return run_planned(self.packed, self.plans, x, self.dense)


def kernel_group(sorted_g_idx: torch.Tensor) -> int | None:
    """The largest kernel group size whose blocks of consecutive (sorted) rows each lie in one group."""
    rows = int(sorted_g_idx.numel())
    for size in sorted(KERNEL_GROUP_SIZES, reverse=True):
        if rows % size == 0:
            blocks = sorted_g_idx.reshape(-1, size)
            if bool((blocks == blocks[:, :1]).all()):
                return size
    return None


def _padded(sorted_g_idx: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each group's (sorted) rows followed by padding up to whole blocks of ``size``.

    Returns ``(rows, groups)``: for each kernel row the sorted row it takes
    (``-1`` for padding) and its group.
    """
    values, counts = torch.unique_consecutive(sorted_g_idx, return_counts=True)
    rows, groups, start = [], [], 0
    for group, count in zip(values.tolist(), counts.tolist(), strict=True):
        padding = -count % size
        rows += [torch.arange(start, start + count), torch.full((padding,), -1)]
        groups.append(torch.full((count + padding,), group))
        start += count
    return torch.cat(rows), torch.cat(groups)


def _int4(weight: QuantizedWeight, dtype: torch.dtype) -> Int4Kernel | str:
    """The int4 kernel, or why it cannot take the layer: decided from ``g_idx`` and the shape alone, before any
    copy of the codes is sorted, padded or packed (a layer that falls back costs nothing here)."""
    perm = torch.argsort(weight.g_idx, stable=True) if weight.act_order else None
    g_idx = weight.g_idx if perm is None else weight.g_idx[perm]
    size = kernel_group(g_idx)
    padded = size is None
    rows = None
    if size is None:
        # a rank's act-order rows, or groups smaller than 32: pad each group with rows that read a zero input
        size = min(KERNEL_GROUP_SIZES)
        rows, g_idx = _padded(g_idx, size)
    reason = int4_unsupported_reason(weight.out_features, int(g_idx.numel()), size)
    if reason is not None:
        return reason
    codes = weight.codes if perm is None else weight.codes[perm]
    if rows is not None:
        source = torch.arange(weight.in_features) if perm is None else perm
        perm = torch.where(rows >= 0, source[rows.clamp(min=0)], weight.in_features)
        codes = torch.where((rows >= 0).unsqueeze(1), codes[rows.clamp(min=0)], 8)
    block_groups = g_idx[::size].long()
    scales = weight.scales[block_groups]
    biases = -weight.zeros[block_groups].to(torch.float32) * scales
    packed = pack_int4(codes.t(), scales, biases, size, dtype)
    return Int4Kernel(packed, perm, KernelChoice("int4pack", packed.reason), padded)



def _int8(weight: QuantizedWeight, dtype: torch.dtype) -> Int8Kernel | Int8PlanesKernel | Int8GroupsKernel | str:
    """The int8 kernel for a channelwise weight; a grouped one takes a grouped kernel when one fits (else the
    int8 kernel's reason stands: the layer falls back)."""
    used = torch.unique(weight.g_idx)
    reason = int8_unsupported_reason(int(used.numel()))
    if reason is not None:
        grouped = pack_grouped_int8(weight, dtype)
        return grouped if grouped is not None else reason
    group = int(used[0])
    return Int8Kernel(pack_int8(weight.codes.t(), weight.scales[group], weight.zeros[group], dtype),
                      KernelChoice("int8pack"))


def _marlin(weight: QuantizedWeight, dtype: torch.dtype) -> LayerKernel | str:
    reason = marlin_cuda_unavailable_reason(weight.codes.device) or marlin_unsupported_reason(weight)
    if reason is not None:
        return reason
    compute = dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16
    return marlin_kernel(repack(weight, compute), weight.codes.device)


def wanted_kernel(bits: int, requested: str, on_cuda: bool) -> tuple[str, str | None]:
    """The kernel a layer asks for — ``requested``, or for ``auto`` Marlin on a CUDA device and torch's packed
    kernel for its bits on the CPU — and why it cannot take such weights at all (``None``: the shapes decide)."""
    if on_cuda or requested == "marlin":
        return "marlin", None
    preferred = "int4pack" if bits == 4 else "int8pack"
    wanted = preferred if requested == "auto" else requested
    return wanted, None if wanted == preferred else f"the {wanted} kernel does not take {bits}-bit weights"


def plan_kernel(geometry: LayerGeometry, *, bits: int, group_size: int, act_order: bool, requested: str,
                device: torch.device, dtype: torch.dtype | None = None) -> KernelChoice:
    """The choice :func:`choose_kernel` will make for a layer of this shape, from the shapes alone.

    Exact except for what only values tell: Marlin refuses a GPTQ v1 zero
    point that wraps (the plan says ``marlin``; the load falls back). ``dtype``: the layer's (default: the
    load session's), which decides whether grouped 8-bit weights take the int8 planes.
    """
    if requested == FALLBACK:
        return _REQUESTED_FALLBACK
    k, n = geometry.rows, geometry.cols
    kernel, reason = wanted_kernel(bits, requested, device.type == "cuda")
    if reason is None and kernel == "marlin":
        reason = marlin_cuda_unavailable_reason(device) or marlin_shape_reason(bits, group_size, k, n, geometry.groups)
    elif reason is None:
        # the rows' groups in sorted order: contiguous unless this rank holds an act-order share (unknown here)
        known = not act_order or geometry.whole_input
        sorted_g_idx = default_g_idx(k, group_size, geometry.first_group * max(group_size, 0)) if known else None
        if bits == 8:
            groups = int(torch.unique(sorted_g_idx).numel()) if sorted_g_idx is not None else geometry.groups
            reason = int8_unsupported_reason(groups)
            grouped = grouped_int8_kernel(n, k, group_size, act_order, dtype or current_session().dtype)
            if reason is not None and grouped is not None:
                return KernelChoice(grouped)
        else:
            size = kernel_group(sorted_g_idx) if sorted_g_idx is not None else None
            rows = k if size is not None else -(-k // KERNEL_GROUP_SIZES[0]) * KERNEL_GROUP_SIZES[0]
            reason = int4_unsupported_reason(n, rows, size or KERNEL_GROUP_SIZES[0])
    return choose_from([KernelOption(kernel, reason)], FALLBACK)


_BUILDERS = {"marlin": _marlin, "int4pack": _int4, "int8pack": _int8}


def choose_kernel(weight: QuantizedWeight, requested: str, dtype: torch.dtype) -> LayerKernel:
    """The kernel for this layer: ``requested`` (or the best for ``auto``), else the dequantize fallback.

    On a CUDA device the choice is Marlin or the fallback; torch's packed
    kernels are CPU kernels.
    """
    if requested == FALLBACK:
        return DequantizeKernel(weight, _REQUESTED_FALLBACK)
    kernel, reason = wanted_kernel(weight.bits, requested, weight.codes.device.type == "cuda")
    made: LayerKernel | str | None = None
    if reason is None:
        made = _BUILDERS[kernel](weight, dtype)
        reason = made if isinstance(made, str) else made.choice.reason
    choice = choose_from([KernelOption(kernel, reason)], FALLBACK)
    if choice.kernel == FALLBACK or made is None or isinstance(made, str):
        return DequantizeKernel(weight, choice)
    return made
