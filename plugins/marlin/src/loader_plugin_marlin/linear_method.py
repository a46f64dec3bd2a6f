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
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch

from loader.layers import LinearMethodBase, LinearShape, ParamLayout, WeightLoader, set_param_layout
from loader.models import current_session

from .kernels import LayerKernel
from .layer_geometry import LayerGeometry, layer_geometry
from .layer_kernels import build_kernel, plan_weight, register_kernel_buffers, with_layer_buffers
from .param_specs import ParamSpec, land_shape_record, land_shared_g_idx
from .quantized_weight import QuantizedWeight

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import LinearBase, NarrowedPart

    from .config import PackedQuantConfig

__all__ = ["PackedLayerState", "PackedLinearMethod"]


@attrs.define
class PackedLayerState:
    """One layer's geometry, the checkpoint tensors it holds, the g_idx parts seen and, once chosen, its kernel."""

    geometry: LayerGeometry
    names: tuple[str, ...]
    params_dtype: torch.dtype
    g_idx_parts: list[object] = attrs.field(factory=list)
    kernel: LayerKernel | None = None


class PackedLinearMethod(LinearMethodBase):
    """One layer of a packed checkpoint: created, loaded, checked, given a kernel and multiplied."""

    layer_state_attr = "packed_state"

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
        for spec in specs:
            param = torch.nn.Parameter(torch.empty(spec.shape, dtype=spec.dtype), requires_grad=False)
            set_param_layout(param, self._layout(linear, spec, shape.weight_loader))
            layer.register_parameter(spec.name, param)
        self.set_layer_state(layer, PackedLayerState(
            geometry=geometry, names=tuple(spec.name for spec in specs), params_dtype=shape.params_dtype))

    def _layout(self, layer: LinearBase, spec: ParamSpec, weight_loader: WeightLoader) -> ParamLayout:
        load_part = None
        if spec.kind == "g_idx":
            load_part = functools.partial(self._load_g_idx, layer, spec.name)
        elif spec.kind == "shape":
            load_part = functools.partial(self._check_shape_record, layer)
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
        tensors = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names}
        return self.config.layout.to_quantized(tensors, state.geometry)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Convert and check the checkpoint tensors, choose the kernel, replace the parameters by its buffers."""
        state = self.layer_state(layer, PackedLayerState)
        if state.kernel is not None:
            return
        tensors = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names}
        kernel = build_kernel(self.config, state.geometry, tensors, state.params_dtype)
        del tensors
        for name in state.names:
            delattr(layer, name)
        register_kernel_buffers(layer, kernel)
        state.kernel = kernel
        self.config.kernel_log[state.geometry.prefix] = kernel.choice

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """Refused, by what the load did: it repacked the checkpoint tensors into the kernel's own buffers and
        removed them, so new checkpoint tensors have no parameter to land in (repacking into the existing
        buffers is not built)."""
        state = self.layer_state(layer, PackedLayerState)
        kernel = f"the {state.kernel.choice.kernel} kernel's" if state.kernel is not None else "its kernel's"
        return (f"its quantize method {type(self).__name__} repacked the checkpoint tensors ({', '.join(state.names)})"
                f" into {kernel} buffers at load, which replaced them; load the new checkpoint with loader.load_model")

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
