"""GGUF mixture-of-experts layers kept packed on the CPU: one int4 weight per local expert and part.

The format hands each expert of a 3-D ``ffn_*_exps`` tensor as its own 2-D GGUF window
(:mod:`loader_plugin_gguf.format.experts`), and the fused-experts layer narrows it to this rank
(its experts under expert parallelism, its slice of every expert under tensor parallelism) before
:meth:`GGUFExpertsMethod._record` remembers it — nothing is read until every part is in. Then each expert's
gate and up rows (``w13``) and its down projection (``w2``) are decided and packed exactly as a dense GGUF
linear layer's parts are: :func:`~.decide.decide` chooses the kernel from the block types and shapes (Q4_0 /
Q4_1 / Q4_K on ``int4``, Q8_0 as two int4 planes ``int4x2``), :func:`~.linear_packing.packed_weight` packs
(through the packed-weights bundle, so a later load maps what this one packed) and
:func:`~.linear_packing.keep_packed` registers ``w13_{e}_packed_*`` / ``w2_{e}_packed_*`` buffers. The
forward runs only the experts tokens chose (:func:`loader.layers.run_chosen_experts`), each on the path its
part's plan gives for the rows routed to it (:func:`loader.kernels.plan_weight_paths`, timed once per part
shape on the first expert: every expert of a part has one kind and shape) — the int4 kernel in the kernel's
dtype, or the expert's weight dequantized for the call when many rows reach it — the activations cast back as
the linear method does.

A part that cannot stay packed — another block type (Q5_x, Q6_K, float types), a tensor-parallel slice that
cuts a 32-value group, gate and up needing different kernels, a device other than the CPU — makes that
part (``w13`` or ``w2``) of every expert of the layer one dense 3-D weight, with the reason in the load
report; a GGUF tensor holds every expert in one type, so the experts of a part always agree.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch
import torch.nn.functional as F

from loader.errors import UnsupportedError
from loader.kernels import Int4CpuWeight, Int8GroupedWeight, KernelChoice, TokenPlan, run_planned
from loader.layers import ExpertsShape, FusedMoEMethodBase, ParamLayout, run_chosen_experts, set_param_layout

from ..format.tensors import GGUFTensor
from . import linear_packing
from .decide import Decision, decide, dense_dtype
from .linear_state import GGUFLayerState
from .options import FALLBACK, METHOD_NAME, dtype_name, kernel_dtype_for

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import NarrowedPart

    from .config import GGUFQuantConfig

__all__ = ["GGUFExpertsMethod", "GGUFExpertsState"]

PARTS = ("w13", "w2")
"""Gate and up rows of every local expert (``w13``), and down projections (``w2``)."""


@attrs.define
class GGUFExpertsState:
    """One fused-experts layer: its sizes, the narrowed parts handed to it per (part, local expert), and once
    processed, each part's choice and its packed weights (``None`` for a dense part)."""

    prefix: str
    experts: int
    hidden: int
    inter: int
    params_dtype: torch.dtype
    parts: dict[tuple[str, int], list[NarrowedPart]] = attrs.field(factory=dict)
    choices: dict[str, KernelChoice] = attrs.field(factory=dict)
    packed: dict[str, list[Int4CpuWeight | None]] = attrs.field(factory=dict)
    plans: dict[str, tuple[TokenPlan, ...]] = attrs.field(factory=dict)
    """A packed part's path per activation dtype and rows per expert call (every expert of the part alike)."""

    def shape(self, part: str) -> tuple[int, int]:
        """One expert's ``(rows, cols)`` of ``part`` on this rank."""
        return (2 * self.inter, self.hidden) if part == "w13" else (self.hidden, self.inter)


class GGUFExpertsMethod(FusedMoEMethodBase):
    """A GGUF file's experts: each expert's parts remembered, then packed to int4 or dequantized per part."""

    layer_state_attr = "gguf_experts_state"
    process_weights_concurrently = True  # reads its own parts, writes its own buffers; packs in C or torch ops

    def __init__(self, config: GGUFQuantConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: ExpertsShape) -> None:
        experts, inter, hidden = shape.num_local_experts, shape.intermediate_size_per_partition, shape.hidden_size
        # empty placeholders: what they become (int4 buffers or dense weights) is known once the block types are;
        # the layer still checks each expert's shape against the logical one and narrows it to this rank
        for part, rows, cols in (("w13", 2 * inter, hidden), ("w2", hidden, inter)):
            param = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
            set_param_layout(param, ParamLayout(
                weight_loader=shape.weight_loader, output_dim=1, input_dim=2, logical_shape=(experts, rows, cols),
                load_part=functools.partial(self._record, layer, part)))
            layer.register_parameter(f"{part}_weight", param)
        prefix = str(getattr(layer, "prefix", "")) or type(layer).__name__
        self.set_layer_state(layer, GGUFExpertsState(prefix, experts, hidden, inter, shape.params_dtype))

    def _record(self, layer: nn.Module, part: str, param: torch.Tensor, narrowed: NarrowedPart) -> None:
        """Remember one expert's narrowed part (nothing is read until every part is in)."""
        if not isinstance(narrowed.narrowed, GGUFTensor):
            raise UnsupportedError(
                f"{narrowed.narrowed.describe()}: quantization={METHOD_NAME!r} keeps GGUF blocks packed, but this "
                "tensor does not come from a GGUF file; load it without that option")
        if narrowed.expert is None:
            raise UnsupportedError(f"{narrowed.narrowed.describe()}: packed GGUF experts take one expert at a time")
        state = self.layer_state(layer, GGUFExpertsState)
        state.parts.setdefault((part, narrowed.expert), []).append(narrowed)

    def _kernel_dtype(self, state: GGUFExpertsState) -> torch.dtype:
        return self.config.kernel_dtype or kernel_dtype_for(state.params_dtype)

    def _decisions(self, state: GGUFExpertsState, part: str, device: torch.device) -> list[Decision]:
        """Each local expert's decision for ``part``, as a dense linear layer of that shape decides."""
        rows, cols = state.shape(part)
        return [decide(GGUFLayerState(prefix=f"{state.prefix}.{part}", rows=rows, cols=cols,
                                      params_dtype=state.params_dtype, parts=state.parts[(part, expert)]),
                       device, self._kernel_dtype(state))
                for expert in range(state.experts)]

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Pack every local expert's ``w13`` and ``w2`` to int4, or dequantize the part (reason recorded)."""
        state = self.layer_state(layer, GGUFExpertsState)
        if state.choices:
            return
        for part in PARTS:
            param = cast(torch.Tensor, getattr(layer, f"{part}_weight"))
            decisions = self._decisions(state, part, param.device)
            delattr(layer, f"{part}_weight")
            reason = _dense_reason(decisions)
            if reason is None:
                state.choices[part] = self._keep_packed(layer, state, part, decisions)
            else:
                state.choices[part] = self._keep_dense(layer, state, part, decisions, reason, param.device)
            self.config.layer_log[f"{state.prefix}.{part}"] = state.choices[part]
        state.parts.clear()

    def _keep_packed(self, layer: nn.Module, state: GGUFExpertsState, part: str,
                     decisions: list[Decision]) -> KernelChoice:
        kernel, size = decisions[0].kernel, 0
        weights: list[Int4CpuWeight | None] = []
        for expert, decision in enumerate(decisions):
            tensors = [tensor for _, tensor in decision.tensors]
            packed = linear_packing.packed_weight(self.config, kernel, tensors, self._kernel_dtype(state))
            size += linear_packing.keep_packed(layer, f"{part}_{expert}_", packed)
            weights.append(packed)
        state.packed[part] = weights
        first = linear_packing.kernel_weight(kernel, cast(Int4CpuWeight, weights[0]))
        plan = linear_packing.plan_paths(first, kernel, self._kernel_dtype(state), state.params_dtype)
        state.plans[part] = (plan,)
        return KernelChoice(kernel, None, decisions[0].types, size, paths=(plan,))

    def _keep_dense(self, layer: nn.Module, state: GGUFExpertsState, part: str, decisions: list[Decision],
                    reason: str, device: torch.device) -> KernelChoice:
        dtype = dense_dtype(GGUFLayerState(prefix=state.prefix, rows=0, cols=0, params_dtype=state.params_dtype),
                            decisions[0].types, self.config.dense_dtype)
        rows, cols = state.shape(part)
        dense = torch.empty(state.experts, rows, cols, dtype=dtype, device=device)
        for expert, decision in enumerate(decisions):
            # gate rows then up rows, as the parts' destination offsets say
            for offset, tensor in decision.tensors:
                dense[expert, offset:offset + int(tensor.shape[0])].copy_(tensor.read(dtype))
        layer.register_parameter(f"{part}_weight", torch.nn.Parameter(dense, requires_grad=False))
        state.packed[part] = [None] * state.experts
        return KernelChoice(FALLBACK, reason, decisions[0].types, 0, dtype_name(dtype))

    def int4_weight(self, layer: nn.Module, part: str, expert: int) -> Int4CpuWeight | Int8GroupedWeight | None:
        """Local expert ``expert``'s packed ``part`` (``w13`` or ``w2``) over the layer's current buffers, or
        ``None`` when that part was dequantized."""
        state = self.layer_state(layer, GGUFExpertsState)
        choice = state.choices.get(part)
        if choice is None:
            raise RuntimeError(f"{state.prefix}: weights are not processed yet")
        if choice.kernel == FALLBACK:
            return None
        cached = linear_packing.current_packed(layer, f"{part}_{expert}_", state.packed[part][expert])
        state.packed[part][expert] = cached
        return linear_packing.kernel_weight(choice.kernel, cached)

    def _project(self, layer: nn.Module, part: str, expert: int, rows: torch.Tensor) -> torch.Tensor:
        packed = self.int4_weight(layer, part, expert)
        if packed is None:
            weight = cast(torch.Tensor, getattr(layer, f"{part}_weight"))[expert]
            return F.linear(rows.to(weight.dtype), weight).to(rows.dtype)
        state = self.layer_state(layer, GGUFExpertsState)
        return run_planned(packed, state.plans.get(part, ()), rows).to(rows.dtype)

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,  # type: ignore[override]
              topk_ids: torch.Tensor) -> torch.Tensor:
        """The chosen experts only, each ``down(silu(gate(x)) * up(x))`` on its packed (or dense) parts."""
        state = self.layer_state(layer, GGUFExpertsState)

        def expert(index: int, rows: torch.Tensor) -> torch.Tensor:
            gate, up = self._project(layer, "w13", index, rows).chunk(2, dim=-1)
            return self._project(layer, "w2", index, F.silu(gate) * up)

        return run_chosen_experts(x, topk_weights, topk_ids, state.experts, expert)


def _dense_reason(decisions: list[Decision]) -> str | None:
    """Why the part of these experts cannot stay packed (``None``: every expert packs on one kernel)."""
    first = decisions[0]
    if first.reason is not None:
        return first.reason
    if first.segments:
        return f"gate and up need different kernels ({first.kernel})"
    if first.row_window is not None or any(d.kernel != first.kernel or d.reason for d in decisions):
        return "the experts' parts need different kernels"
    return None
