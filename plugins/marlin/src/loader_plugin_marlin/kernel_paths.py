"""Which path each packed CPU kernel runs per activation dtype and tokens, and the dense copies a load keeps.

The core plans (:mod:`loader.kernels.token_plan`): ``packed`` (the kernel in the activations' dtype),
``packed-bf16`` (float32 activations cast to bfloat16 and back), ``dequantize`` (the weight dequantized from
the kept codes every call) and ``dense`` (dequantized once). This module decides what the kernel is packed in
and attaches the plan to a built kernel (:func:`with_paths`):

* the kernel dtype (:func:`kernel_dtype_for`): the load's dtype, except that a float32 load packs its scales
  in bfloat16 — torch's int4 kernel in float32 was 10-50x slower than on bfloat16-cast activations on every
  size measured — unless ``quantization_options={"exact_float32": True}``, which keeps float32 scales and only
  paths that compute in float32 (``dequantize``, ``dense``);
* the plan: timed on this machine at the first layer of each kind (``LOADER_KERNEL_MEASURE=0``: the static rule);
* the dense copy: kept for a layer whose plan runs ``dense`` for some token bucket, only while the load's copies
  stay within ``LOADER_KERNEL_DENSE_BUDGET`` bytes (default 0: never; a quantized model keeps its size).

Kernels without paths (Marlin on CUDA, the dequantize fallback of what no kernel takes) are left as built.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from loader.kernels import DENSE, Int4CpuWeight, PathWeight, plan_weight_paths

from .grouped_int8_kernels import GroupedPathWeight, Int8GroupsKernel, Int8PlanesKernel
from .kernels import Int4Kernel, Int8Kernel, LayerKernel

__all__ = ["PATH_KERNELS", "DenseBudget", "kernel_dtype_for", "path_weight", "with_paths"]

PATH_KERNELS = ("int4pack", "int8pack", "int8planes", "int8groups")
"""The kernels (as choices name them) that run paths; the others (Marlin, the dequantize fallback) do not."""

_SOURCES = (Path(__file__).with_name("kernels.py"), Path(__file__).with_name("grouped_int8_kernels.py"))


@attrs.define
class DenseBudget:
    """The bytes of dequantized copies one load may still keep (``LOADER_KERNEL_DENSE_BUDGET``)."""

    left: int = 0

    def take(self, size: int) -> bool:
        """Reserve ``size`` bytes when they fit; whether they did."""
        if size > self.left:
            return False
        self.left -= size
        return True


def kernel_dtype_for(load_dtype: torch.dtype, exact: bool) -> torch.dtype:
    """What a packed kernel's scales are kept in: the load's dtype, bfloat16 for float32 unless ``exact``."""
    return torch.bfloat16 if load_dtype == torch.float32 and not exact else load_dtype


def path_weight(kernel: LayerKernel) -> PathWeight | None:
    """The weight a kernel's paths run on, or ``None`` for a kernel without paths."""
    if isinstance(kernel, Int4Kernel | Int8Kernel):
        return kernel.packed
    if isinstance(kernel, Int8PlanesKernel | Int8GroupsKernel):
        return GroupedPathWeight(kernel)
    return None


def _kind(kernel: LayerKernel, weight: PathWeight) -> str:
    """The layer kind timings are kept under (the core adds K and the rows timed)."""
    detail = ""
    if isinstance(kernel, Int4Kernel):
        packed: Int4CpuWeight = kernel.packed
        detail = f":g={packed.group_size}:perm={kernel.in_perm is not None}"
    elif isinstance(kernel, Int8GroupsKernel):
        detail = f":rows={int(kernel.codes.shape[2])}"
    symmetric = getattr(kernel, "offsets", None) is None
    return f"marlin:{type(kernel).__name__}{detail}:sym={symmetric}:{str(weight.kernel_dtype).removeprefix('torch.')}"


def with_paths(kernel: LayerKernel, dtype: torch.dtype, *, exact: bool, budget: DenseBudget) -> LayerKernel:
    """``kernel`` with its plan for activations of ``dtype`` (and the dense copy when the plan runs it)."""
    weight = path_weight(kernel)
    if weight is None or not attrs.has(type(kernel)):
        return kernel
    dense_bytes = weight.out_features * weight.in_features * dtype.itemsize
    may_keep = 0 < dense_bytes <= budget.left
    plan = plan_weight_paths(weight, _kind(kernel, weight), dtype, exact=exact, dense=may_keep,
                             extra_sources=_SOURCES)
    dense = None
    if DENSE in plan.paths and budget.take(dense_bytes):
        dense = weight.dequantize(dtype)
    choice = attrs.evolve(kernel.choice, paths=(plan,))
    return attrs.evolve(kernel, plans=(plan,), dense=dense, choice=choice)  # type: ignore[misc]
