"""A fused GGUF layer whose parts need different kernels, kept and multiplied one segment at a time.

A Q4_K_M file's ``attn_v`` is Q6_K beside Q4_K ``q``/``k`` in about half the layers, and Q8_0 may sit beside
Q4 parts: one call cannot take two kernels, so each run of consecutive parts on one kernel
(:class:`~.decide.PlannedSegment`) keeps its own buffers (``segment{i}_packed_weight`` /
``segment{i}_packed_scales_and_zeros``, or a dense ``segment{i}_weight``) and the layer's output is the
segments' outputs side by side. Each packed segment is planned like a whole layer of its kernel
(:func:`loader.kernels.plan_weight_paths`: the packed kernel or its dequantized twin per activation dtype and
token count, timed once per segment shape on this machine); the layer's record shows the segments' paths per
bucket joined with ``+`` in row order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import attrs
import torch

from loader.kernels import Int4CpuWeight, Int8GroupedWeight, KernelChoice, TokenPlan, run_planned

from .decide import Decision, PlannedSegment, dense_dtype
from .linear_packing import dense_weight, keep_packed, kernel_weight, packed_buffers, packed_weight, plan_paths
from .linear_state import GGUFLayerState, LayerSegment
from .options import FALLBACK, dtype_name
from .q4_blocks import GROUP_SIZE

if TYPE_CHECKING:
    from torch import nn

    from .config import GGUFQuantConfig

__all__ = ["apply_segments", "current_segments", "keep_segments", "merged_plans"]


def keep_segments(layer: nn.Module, state: GGUFLayerState, decision: Decision, config: GGUFQuantConfig,
                  kernel_dtype: torch.dtype) -> KernelChoice:
    """Each run of parts packed on its kernel or dequantized: buffers ``segment{i}_*``, or ``segment{i}_weight``."""
    packed_total, dense_name = 0, None
    for index, segment in enumerate(decision.segments):
        name = f"segment{index}"
        if segment.kernel == FALLBACK:
            dtype = dense_dtype(state, segment.types, config.dense_dtype)
            dense = dense_weight(segment.tensors, (segment.rows, state.cols), dtype, torch.device("cpu"))
            layer.register_parameter(f"{name}_weight", torch.nn.Parameter(dense, requires_grad=False))
            dense_name = dense_name or dtype_name(dtype)  # the first dense run's, as layer_plan records it
            continue
        packed_total += keep_packed(layer, f"{name}_", packed_weight(config, segment.kernel, segment.tensors,
                                                                     kernel_dtype))
    state.segments = [segment if isinstance(segment.weight, torch.Tensor) else attrs.evolve(
        segment, plans=(plan_paths(segment.weight, segment.kernel, kernel_dtype, state.params_dtype),))
        for segment in _segment_weights(layer, decision.segments, state.cols)]
    paths = merged_plans([segment.plans for segment in state.segments if segment.plans])
    return KernelChoice(decision.kernel, decision.reason, decision.types, packed_total, dense_name, paths=paths)


def merged_plans(plans: Sequence[tuple[TokenPlan, ...]]) -> tuple[TokenPlan, ...]:
    """The packed segments' plans as one record: per dtype and bucket their paths in row order, repeats dropped,
    joined with ``+`` (``packed+dequantize``); the sources likewise. For the report only: each segment runs its
    own plan."""
    merged = []
    for dtype in dict.fromkeys(plan.dtype for segment in plans for plan in segment):
        mine = [plan for segment in plans for plan in segment if plan.dtype == dtype]
        paths = tuple("+".join(dict.fromkeys(names)) for names in zip(*(plan.paths for plan in mine), strict=True))
        merged.append(TokenPlan(dtype, paths, "+".join(dict.fromkeys(plan.source for plan in mine))))
    return tuple(merged)


def _segment_weights(layer: nn.Module, planned: Sequence[PlannedSegment | LayerSegment],
                     cols: int) -> list[LayerSegment]:
    """The segments over the layer's current buffers and parameters (rebuilt after ``module.to``)."""
    segments = []
    for index, segment in enumerate(planned):
        name = f"segment{index}"
        weight: Int4CpuWeight | Int8GroupedWeight | torch.Tensor
        if segment.kernel == FALLBACK:
            weight = cast(torch.Tensor, layer._parameters[f"{name}_weight"])
        else:
            data, sz = packed_buffers(layer, f"{name}_")
            weight = kernel_weight(segment.kernel, Int4CpuWeight(data, sz, GROUP_SIZE, cols))
        plans = segment.plans if isinstance(segment, LayerSegment) else ()
        segments.append(LayerSegment(segment.start, segment.rows, segment.kernel, weight, plans))
    return segments


def current_segments(layer: nn.Module, state: GGUFLayerState) -> list[LayerSegment]:
    """The layer's segments over its current tensors (``module.to`` replaces them; the segments are rebuilt)."""
    if state.segments and not _segments_current(layer, state):
        state.segments = _segment_weights(layer, state.segments, state.cols)
    return list(state.segments)


def _segments_current(layer: nn.Module, state: GGUFLayerState) -> bool:
    """Whether the cached segments still wrap the layer's tensors."""
    for index, segment in enumerate(state.segments):
        weight = segment.weight
        if isinstance(weight, torch.Tensor):
            if layer._parameters.get(f"segment{index}_weight") is not weight:
                return False
            continue
        packed = weight.planes if isinstance(weight, Int8GroupedWeight) else weight
        if (layer._buffers.get(f"segment{index}_packed_weight") is not packed.data
                or layer._buffers.get(f"segment{index}_packed_scales_and_zeros") is not packed.scales_and_zeros):
            return False
    return True


def apply_segments(segments: Sequence[LayerSegment], x: torch.Tensor) -> torch.Tensor:
    """Each segment's rows of ``x W^T`` on its own kernel (a packed one on its planned path), side by side in
    ``x``'s dtype."""
    outs = []
    for segment in segments:
        weight = segment.weight
        if isinstance(weight, torch.Tensor):
            outs.append(torch.nn.functional.linear(x.to(weight.dtype), weight).to(x.dtype))
        else:
            outs.append(run_planned(weight, segment.plans, x).to(x.dtype))
    return torch.cat(outs, dim=-1)
