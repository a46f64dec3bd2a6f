"""The quantize method of fused-experts layers for every packed-integer format: one packed kernel per expert.

GPTQModel and llm-compressor quantize each expert's ``gate_proj``/``up_proj``/
``down_proj`` as its own linear layer, so a checkpoint holds the format's
tensors per expert (``experts.7.gate_proj.qweight``, ``...weight_packed``).
The core's :class:`~loader.layers.FusedMoE` maps them onto 3-D parameters
named ``w13_<tensor>`` (gate then up along the output) and ``w2_<tensor>``,
experts outermost, whose layouts are the format's per-layer
:class:`~loader_plugin_marlin.param_specs.ParamSpec`\\ s with one more
leading dimension; the layer narrows each tensor to this rank as a linear
layer would (gate/up a column-parallel split of the intermediate dimension,
down a row-parallel one whose groups :mod:`~loader_plugin_marlin.layer_geometry`
checks), or skips other ranks' experts under expert parallelism.

After loading, each local expert's gate/up and down become one kernel each,
exactly as a dense layer's weight does (:func:`~loader_plugin_marlin.layer_kernels.build_kernel`:
torch's int4/int8 CPU kernels, Marlin on CUDA, the dequantize fallback), kept
as buffers ``packed_w13_<expert>_*``; the forward runs only the experts the
tokens chose (:func:`~loader.layers.run_chosen_experts`).
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, cast

import attrs
import torch
import torch.nn.functional as F

from loader.layers import (
    ExpertsShape,
    FusedMoE,
    FusedMoEMethodBase,
    ParamLayout,
    WeightLoader,
    run_chosen_experts,
    set_param_layout,
)
from loader.models import current_session

from .deferred_parts import DeferredParts, cached_kernel, defers_reads
from .layer_geometry import LayerGeometry, layer_geometry
from .layer_kernels import (
    BUFFER_PREFIX,
    combined_choice,
    plan_weight,
    register_kernel_buffers,
    with_layer_buffers,
)
from .param_specs import ParamSpec, land_shape_record, land_shared_g_idx
from .word_packing import word_tensor

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import NarrowedPart

    from .config import PackedQuantConfig
    from .kernels import LayerKernel

__all__ = ["PackedExpertsState", "PackedFusedMoEMethod"]

KINDS = ("w13", "w2")
"""Gate and up of each expert (one kernel, gate columns first), and down."""


@attrs.define
class PackedExpertsState:
    """One fused-experts layer's two weight geometries (per expert), tensors held, g_idx parts seen, kernels."""

    geometries: dict[str, LayerGeometry]
    names: dict[str, tuple[str, ...]]
    params_dtype: torch.dtype
    g_idx_parts: dict[tuple[str, int], object] = attrs.field(factory=dict)
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    kernels: dict[str, list[LayerKernel]] | None = None
    deferred: DeferredParts | None = None
    """The parts of the ``copy`` tensors remembered while a load with a packed-weights bundle lands them."""


def _expert_dim(dim: int | None) -> int | None:
    return None if dim is None else dim + 1


def _geometries(config: PackedQuantConfig, layer: FusedMoE, shape: ExpertsShape) -> dict[str, LayerGeometry]:
    """One expert's gate/up and down shard on this rank, checked as linear layers are (a TP size that cuts a
    group of the down projection's input, or a packed word, is refused here, naming the layer)."""
    placement, layout, per_rank = layer.placement, config.layout, shape.intermediate_size_per_partition
    split = functools.partial(layer_geometry, tp_rank=placement.slice_rank, tp_size=placement.slice_count,
                              bits=config.bits, group_size=config.group_size, act_order=config.act_order,
                              input_pack=layout.input_pack, output_pack=layout.output_pack)
    gate, down, up = (layer.names.by_part[part] for part in ("w1", "w2", "w3"))
    return {
        "w13": split(f"{layer.prefix} ({gate}, {up})", shape.hidden_size, [per_rank, per_rank], shape.hidden_size),
        "w2": split(f"{layer.prefix} ({down})", per_rank, [shape.hidden_size], shape.intermediate_size),
    }


class PackedFusedMoEMethod(FusedMoEMethodBase):
    """A fused-experts layer of a packed checkpoint: created, loaded per expert, given kernels and run."""

    layer_state_attr = "packed_experts_state"
    process_weights_concurrently = True  # converts its own tensors into its own buffers

    def __init__(self, config: PackedQuantConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: ExpertsShape) -> None:
        experts = cast(FusedMoE, layer)
        geometries = _geometries(self.config, experts, shape)
        names: dict[str, tuple[str, ...]] = {}
        deferred = DeferredParts() if defers_reads(self.config) else None
        for kind, geometry in geometries.items():
            specs = self.config.layout.params(geometry)
            for spec in specs:
                param = torch.nn.Parameter(torch.empty((shape.num_local_experts, *spec.shape), dtype=spec.dtype),
                                           requires_grad=False)
                set_param_layout(param, self._layout(experts, kind, spec, shape.weight_loader, deferred))
                layer.register_parameter(f"{kind}_{spec.name}", param)
            names[kind] = tuple(spec.name for spec in specs)
        self.set_layer_state(layer, PackedExpertsState(geometries, names, shape.params_dtype, deferred=deferred))

    def _layout(self, layer: FusedMoE, kind: str, spec: ParamSpec, weight_loader: WeightLoader,
                deferred: DeferredParts | None) -> ParamLayout:
        load_part = None
        if spec.kind == "g_idx":
            load_part = functools.partial(self._load_g_idx, layer, f"{kind}_{spec.name}")
        elif spec.kind == "shape":
            load_part = functools.partial(self._check_shape_record, layer, kind)
        elif spec.kind == "copy" and deferred is not None:  # remembered, read after loading if needed
            load_part = functools.partial(deferred.remember, f"{kind}_{spec.name}")
        return ParamLayout(weight_loader=weight_loader, output_dim=_expert_dim(spec.output_dim),
                           input_dim=_expert_dim(spec.input_dim), packed_dim=_expert_dim(spec.packed_dim),
                           pack_factor=spec.pack_factor, load_part=load_part)

    def _expert_name(self, layer: FusedMoE, kind: str, index: int) -> str:
        """How messages name one local expert's weight: its checkpoint module(s), ``...experts.7.down_proj``."""
        expert = layer.placement.first_expert + index
        parts = ("w1", "w3") if kind == "w13" else ("w2",)
        return f"{layer.prefix}.{expert}.{'+'.join(layer.names.by_part[p] for p in parts)}"

    def _load_g_idx(self, layer: FusedMoE, name: str, param: torch.Tensor, part: NarrowedPart) -> None:
        """Copy an expert's ``g_idx``; its gate and up parts must bring the same one (one input, one order)."""
        assert part.expert is not None
        state = self.layer_state(layer, PackedExpertsState)
        key = (name, part.expert)
        with state.lock:
            where = f"{self._expert_name(layer, name.partition('_')[0], part.expert)}.{name.partition('_')[2]}"
            land_shared_g_idx(param.data[part.expert], part, state.g_idx_parts.get(key), where)
            state.g_idx_parts.setdefault(key, part.shard_id)

    def _check_shape_record(self, layer: FusedMoE, kind: str, param: torch.Tensor, part: NarrowedPart) -> None:
        """compressed-tensors' ``weight_shape``: the expert part's full ``[rows, cols]``."""
        assert part.expert is not None
        rows, cols = layer.intermediate_size, layer.hidden_size
        expected = [cols, rows] if kind == "w2" else [rows, cols]
        expert = layer.placement.first_expert + part.expert
        what = f"{layer.prefix}.{expert}.{layer.names.by_part[str(part.shard_id)]}"
        land_shape_record(param.data[part.expert], part, expected, what)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Each local expert's gate/up and down converted and checked into a kernel; the checkpoint-layout
        parameters replaced by the kernels' buffers."""
        experts = cast(FusedMoE, layer)
        state = self.layer_state(layer, PackedExpertsState)
        if state.kernels is not None:
            return
        kernels: dict[str, list[LayerKernel]] = {}
        deferred = state.deferred if state.deferred is not None else DeferredParts()
        for kind, geometry in state.geometries.items():
            remembered = {f"{kind}_{n}": n for n in state.names[kind] if f"{kind}_{n}" in deferred.parts}
            built = []
            for index in range(experts.num_local_experts):
                where = attrs.evolve(geometry, prefix=self._expert_name(experts, kind, index))
                values = {n: cast(torch.Tensor, getattr(layer, f"{kind}_{n}")).data[index] for n in state.names[kind]
                          if f"{kind}_{n}" not in remembered}
                kernel = cached_kernel(self.config, where, state.params_dtype, method=type(self).__name__,
                                       deferred=deferred.of_expert(remembered, index), values=values,
                                       tensors=functools.partial(self._expert_tensors, layer, kind, index))
                deferred.give_back()
                register_kernel_buffers(layer, kernel, f"{BUFFER_PREFIX}{kind}_{index}_")
                built.append(kernel)
            kernels[kind] = built
            for name in state.names[kind]:
                delattr(layer, f"{kind}_{name}")
        state.kernels, state.deferred = kernels, None
        self.config.kernel_log[experts.prefix] = combined_choice(
            kernel.choice for built in kernels.values() for kernel in built)

    def _expert_tensors(self, layer: nn.Module, kind: str, index: int) -> dict[str, torch.Tensor]:
        """Local expert ``index``'s ``kind`` checkpoint tensors, its remembered parts landed first."""
        state = self.layer_state(layer, PackedExpertsState)
        aside = word_tensor(self.config)
        tensors: dict[str, torch.Tensor] = {}
        for name in state.names[kind]:
            param = cast(torch.Tensor, getattr(layer, f"{kind}_{name}"))
            if state.deferred is not None and f"{kind}_{name}" in state.deferred.parts:
                mine = [p for p in state.deferred.parts[f"{kind}_{name}"] if p.expert == index]
                if name == aside:
                    tensors[name] = state.deferred.land_aside(f"{kind}_{name}", param, mine, index)
                else:
                    state.deferred.land(f"{kind}_{name}", param, mine)
        for name in state.names[kind]:
            if name not in tensors:
                tensors[name] = cast(torch.Tensor, getattr(layer, f"{kind}_{name}")).data[index]
        return {name: tensors[name] for name in state.names[kind]}

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """The kernels the experts will get on the load's device, from their shapes (``loader inspect --layers``)."""
        state = self.layer_state(layer, PackedExpertsState)
        device = current_session().device
        return combined_choice(plan_weight(self.config, geometry, device) for geometry in state.geometries.values())

    def kernel(self, layer: nn.Module, kind: str, index: int) -> LayerKernel:
        """Local expert ``index``'s gate/up (``"w13"``) or down (``"w2"``) kernel, holding the layer's current
        buffers (rebuilt around them after ``layer.to(...)``)."""
        state = self.layer_state(layer, PackedExpertsState)
        if state.kernels is None:
            raise RuntimeError(f"{cast(FusedMoE, layer).prefix}: weights are not processed yet (no kernel chosen)")
        built = state.kernels[kind]
        built[index] = with_layer_buffers(built[index], layer, f"{BUFFER_PREFIX}{kind}_{index}_")
        return built[index]

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,  # type: ignore[override]
              topk_ids: torch.Tensor) -> torch.Tensor:
        def expert(index: int, rows: torch.Tensor) -> torch.Tensor:
            gate, up = self.kernel(layer, "w13", index).matmul(rows).chunk(2, dim=-1)
            return self.kernel(layer, "w2", index).matmul(F.silu(gate) * up)

        return run_chosen_experts(x, topk_weights, topk_ids, cast(FusedMoE, layer).num_local_experts, expert)
