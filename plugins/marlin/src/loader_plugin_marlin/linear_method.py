"""The quantize method of the parallel linear layers for every packed-integer format.

The format's :class:`~loader_plugin_marlin.param_specs.CheckpointLayout`
says which tensors a layer holds; they become parameters named as in the
checkpoint, so model plugins route them like dense weights
(``qkv_proj.qweight`` from ``q_proj.qweight`` with shard id ``"q"``), and the
layer's own ``weight_loader`` splits fused tensors, checks shapes and narrows
to this rank (:mod:`~loader_plugin_marlin.layer_geometry` has checked that the
split is one the format can express).

After loading, the tensors are converted into a
:class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`, checked, and
handed to :func:`~loader_plugin_marlin.layer_kernels.build_kernel` (a wide
layer bound for the int4 CPU kernel a slice of columns at a time, to keep the
load's peak low); the checkpoint-layout parameters are then dropped and the
kernel's tensors become the layer's buffers. The fused-experts method
(:mod:`~loader_plugin_marlin.fused_moe_method`) does the same per expert.

A live weight update (``loader.update_weights``) reopens the layer: the
checkpoint-layout parameters come back, the new checkpoint's tensors land in
them as at load, and the second post-processing builds the kernel again and
copies it into the existing buffers (same storage), once the layer was given
its whole tensor set.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch

from loader.layers import LinearMethodBase, LinearShape, ParamLayout, WeightLoader, set_param_layout
from loader.models import current_session

from .deferred_parts import DeferredParts, cached_kernel, defers_reads
from .kernels import LayerKernel
from .layer_geometry import LayerGeometry, layer_geometry
from .layer_kernels import (
    plan_weight,
    refill_kernel_buffers,
    register_kernel_buffers,
    with_layer_buffers,
)
from .param_specs import ParamSpec, land_part_scalar, land_shape_record, land_shared_g_idx
from .quantized_weight import QuantizedWeight
from .reopened_layers import check_whole_set, drop_reopened
from .word_packing import layer_kernel, word_tensor

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import LinearBase, NarrowedPart

    from .config import PackedQuantConfig

__all__ = ["PackedLayerState", "PackedLinearMethod", "UpdateRecord"]


@attrs.define
class PackedLayerState:
    """One layer's geometry, the checkpoint tensors it holds, the g_idx parts seen and, once chosen, its kernel."""

    geometry: LayerGeometry
    names: tuple[str, ...]
    params_dtype: torch.dtype
    weight_loader: WeightLoader
    g_idx_parts: list[object] = attrs.field(factory=list)
    kernel: LayerKernel | None = None
    update: UpdateRecord | None = None
    deferred: DeferredParts | None = None
    """The parts of the ``copy`` tensors remembered while a load with a packed-weights bundle lands them."""


@attrs.define
class UpdateRecord:
    """An update's parts written into a layer reopened for it, by checkpoint tensor (``None``: all parts at once)."""

    written: dict[str, set[object]] = attrs.field(factory=dict)


class PackedLinearMethod(LinearMethodBase):
    """One layer of a packed checkpoint: created, loaded, checked, given a kernel and multiplied."""

    layer_state_attr = "packed_state"
    process_weights_concurrently = True  # converts its own tensors into its own buffers

    def __init__(self, config: PackedQuantConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        cfg, layout = self.config, self.config.layout
        linear = cast("LinearBase", layer)
        geometry = layer_geometry(
            linear.display_name, shape.input_size_per_partition, list(shape.output_partition_sizes),
            shape.input_size, tp_rank=linear.tp_rank, tp_size=linear.tp_size, bits=cfg.bits, group_size=cfg.group_size,
            act_order=cfg.act_order, input_pack=layout.input_pack, output_pack=layout.output_pack,
        )
        specs = layout.params(geometry)
        deferred = DeferredParts() if defers_reads(cfg) else None
        self._register_checkpoint_params(linear, specs, shape.weight_loader, device=None, deferred=deferred)
        self.set_layer_state(layer, PackedLayerState(
            geometry=geometry, names=tuple(spec.name for spec in specs), params_dtype=shape.params_dtype,
            weight_loader=shape.weight_loader, deferred=deferred))

    def _register_checkpoint_params(self, layer: LinearBase, specs: list[ParamSpec], weight_loader: WeightLoader,
                                    device: torch.device | None, *, record: bool = False,
                                    deferred: DeferredParts | None = None) -> None:
        """One parameter per spec; ``record``: each write is recorded for an update (:meth:`_record_write`);
        ``deferred``: the ``copy`` tensors' parts are remembered there, not read (:mod:`.deferred_parts`)."""
        for spec in specs:
            param = torch.nn.Parameter(torch.empty(spec.shape, dtype=spec.dtype, device=device), requires_grad=False)
            loader = functools.partial(land_part_scalar, layer.shard_ids()) if spec.kind == "part_scalar" \
                else weight_loader  # one value per part, whole on every rank: no narrowing, no shape of rows
            if record:
                loader = functools.partial(self._record_write, layer, loader)
            set_param_layout(param, self._layout(layer, spec, loader, deferred))
            layer.register_parameter(spec.name, param)

    def _layout(self, layer: LinearBase, spec: ParamSpec, weight_loader: WeightLoader,
                deferred: DeferredParts | None = None) -> ParamLayout:
        load_part = None
        if spec.kind == "g_idx":
            load_part = functools.partial(self._load_g_idx, layer, spec.name)
        elif spec.kind == "shape":
            load_part = functools.partial(self._check_shape_record, layer)
        elif spec.kind == "copy" and deferred is not None:
            load_part = functools.partial(deferred.remember, spec.name)
        return ParamLayout(weight_loader=weight_loader, output_dim=spec.output_dim, input_dim=spec.input_dim,
                           packed_dim=spec.packed_dim, pack_factor=spec.pack_factor, load_part=load_part)

    def _load_g_idx(self, layer: LinearBase, name: str, param: torch.Tensor, part: NarrowedPart) -> None:
        """Copy this rank's ``g_idx``; every part of a fused layer must bring the same one (one input, one order)."""
        state = self.layer_state(layer, PackedLayerState)
        first = state.g_idx_parts[0] if state.g_idx_parts else None
        land_shared_g_idx(param.data, part, first, f"{state.geometry.prefix}.{name}")
        state.g_idx_parts.append(part.shard_id)

    def _check_shape_record(self, layer: LinearBase, param: torch.Tensor, part: NarrowedPart) -> None:
        """A per-part ``[rows, cols]`` record of the unpacked weight: it must be the part's own shape."""
        prefix = self.layer_state(layer, PackedLayerState).geometry.prefix
        expected = [layer.output_part(part.shard_id).full, layer.input_size]
        land_shape_record(param.data, part, expected, f"{prefix} part {part.shard_id!r}")

    def quantized_weight(self, layer: nn.Module) -> QuantizedWeight:
        """This rank's weight in the internal representation, checked (before the kernel is chosen)."""
        state = self.layer_state(layer, PackedLayerState)
        return self.config.layout.to_quantized(self._landed(layer, state), state.geometry)

    @staticmethod
    def _landed(layer: nn.Module, state: PackedLayerState, aside: str | None = None) -> dict[str, torch.Tensor]:
        """The layer's checkpoint tensors, the deferred parts landed first (``aside``'s into scratch)."""
        tensors: dict[str, torch.Tensor] = {}
        for name in list(state.deferred.parts if state.deferred is not None else ()):
            assert state.deferred is not None
            param = cast(torch.Tensor, getattr(layer, name))
            if name == aside:
                tensors[name] = state.deferred.land_aside(name, param)
            else:
                state.deferred.land(name, param)
        return {name: tensors[name] if name in tensors else cast(torch.Tensor, getattr(layer, name)).data
                for name in state.names}

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Convert and check the checkpoint tensors, choose the kernel, replace the parameters by its buffers.

        After an update (the layer reopened by :meth:`open_for_update`), the new tensors are converted the
        same way and the result copied into the kernel's existing buffers, which keep their storage.
        """
        state = self.layer_state(layer, PackedLayerState)
        if state.kernel is not None and state.update is None:
            return
        if state.kernel is None:  # the load: from the packed-weights bundle when it holds the kernel
            deferred = state.deferred.parts if state.deferred is not None else {}
            values = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names
                      if name not in deferred}
            aside = word_tensor(self.config)
            kernel = cached_kernel(self.config, state.geometry, state.params_dtype, method=type(self).__name__,
                                   deferred=deferred, values=values,
                                   tensors=lambda: self._landed(layer, state, aside))
            del values
            if state.deferred is not None:
                state.deferred.give_back()
        else:
            kernel = layer_kernel(self.config, state.geometry, self._landed(layer, state), state.params_dtype)
        state.deferred = None
        for name in state.names:
            delattr(layer, name)
        if state.kernel is not None:
            state.update = None
            refill_kernel_buffers(layer, self.kernel(layer), kernel)
            return
        register_kernel_buffers(layer, kernel)
        state.kernel = kernel
        self.config.kernel_log[state.geometry.prefix] = kernel.choice

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """``None`` once :meth:`open_for_update` gave the layer its checkpoint tensors back as parameters."""
        state = self.layer_state(layer, PackedLayerState)
        if state.update is not None:
            return None
        return (f"its quantize method {type(self).__name__} keeps it as kernel buffers and was not opened for this "
                "update (its tensors were not among the update's names)")

    def open_for_update(self, layer: nn.Module) -> None:
        """Register the checkpoint tensors' parameters again (on the buffers' device), written parts recorded."""
        state = self.layer_state(layer, PackedLayerState)
        if state.kernel is None:
            return
        state.g_idx_parts = []
        if state.update is not None:  # after a probe: the same parameters, nothing written yet
            state.update = UpdateRecord()
            return
        device = next(layer.buffers()).device
        specs = [spec for spec in self.config.layout.params(state.geometry) if spec.name in state.names]
        self._register_checkpoint_params(cast("LinearBase", layer), specs, state.weight_loader, device=device,
                                         record=True)
        state.update = UpdateRecord()

    def _record_write(self, layer: nn.Module, weight_loader: WeightLoader, param: torch.Tensor, loaded: object,
                      shard_id: object = None) -> None:
        state = self.layer_state(layer, PackedLayerState)
        name = next(name for name in state.names if getattr(layer, name) is param)
        if state.update is not None:
            state.update.written.setdefault(name, set()).add(shard_id)
        weight_loader(param, loaded, shard_id)

    def check_update(self, layer: nn.Module) -> None:
        """Every checkpoint tensor of the layer, every part of it: the kernel is rebuilt from the whole set."""
        state = self.layer_state(layer, PackedLayerState)
        if state.update is not None:
            check_whole_set(state.geometry.prefix, type(self).__name__, "a packed layer", state.names,
                            state.update.written, len(state.geometry.parts))

    def close_update(self, layer: nn.Module) -> None:
        """Drop the reopened parameters the update did not consume (nothing, or not all of the set, was given)."""
        state = self.layer_state(layer, PackedLayerState)
        if state.update is None:
            return
        drop_reopened(layer, state.names)
        state.update = None
        state.g_idx_parts = []

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """The kernel this layer will get on the load's device, from its shapes (``loader inspect --layers``)."""
        state = self.layer_state(layer, PackedLayerState)
        return plan_weight(self.config, state.geometry, current_session().device)

    def kernel(self, layer: nn.Module) -> LayerKernel:
        """The kernel chosen after loading, holding the layer's current buffers.

        ``layer.to(...)`` (or ``model.to``) replaces the buffers with new
        tensors; the kernel is then rebuilt around them, so it never keeps the
        old tensors alive or computes with them.
        """
        state = self.layer_state(layer, PackedLayerState)
        if state.kernel is None:
            raise RuntimeError(f"{state.geometry.prefix}: weights are not processed yet (no kernel chosen)")
        state.kernel = with_layer_buffers(state.kernel, layer)
        return state.kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = self.kernel(layer).matmul(x)
        return out if bias is None else out + bias.to(out.dtype)

