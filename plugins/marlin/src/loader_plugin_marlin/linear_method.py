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
handed to :func:`~loader_plugin_marlin.kernels.choose_kernel` (a wide layer
bound for the int4 CPU kernel a slice of columns at a time,
:mod:`~loader_plugin_marlin.column_chunks`, to keep the load's peak low); the
checkpoint-layout parameters are then dropped and the kernel's tensors become
the layer's buffers.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

import attrs
import torch

from loader.errors import CheckpointFormatError
from loader.layers import LinearMethodBase, LinearShape, ParamLayout, WeightLoader, set_param_layout
from loader.models import current_session

from .column_chunks import int4_by_columns
from .kernels import LayerKernel, choose_kernel, plan_kernel
from .layer_geometry import LayerGeometry, layer_geometry
from .param_specs import ParamSpec
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
        values = part.narrowed.read(torch.int32)
        if state.g_idx_parts and not torch.equal(values, param.data):
            raise CheckpointFormatError(
                f"{part.narrowed.describe()}: {state.geometry.prefix}.{name} of part {part.shard_id!r} differs "
                f"from part {state.g_idx_parts[0]!r}; the fused parts share one input and must share one g_idx"
            )
        param.data.copy_(values)
        state.g_idx_parts.append(part.shard_id)

    def _check_shape_record(self, layer: LinearBase, param: torch.Tensor, part: NarrowedPart) -> None:
        """A per-part ``[rows, cols]`` record of the unpacked weight: it must be the part's own shape."""
        values = [int(v) for v in part.narrowed.read(torch.int64).flatten().tolist()]
        expected = [layer.output_part(part.shard_id).full, layer.input_size]
        if values != expected:
            prefix = self.layer_state(layer, PackedLayerState).geometry.prefix
            raise CheckpointFormatError(
                f"{part.narrowed.describe()}: records an unpacked weight of shape {values}, but "
                f"{prefix} part {part.shard_id!r} has shape {expected}"
            )
        param.data.copy_(torch.tensor(expected, dtype=param.dtype))

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
        kernel = self._int4_by_columns(layer, state) or choose_kernel(
            self.quantized_weight(layer), self.config.kernel, state.params_dtype)
        for name in state.names:
            delattr(layer, name)
        for name, tensor in _kernel_tensors(kernel):
            layer.register_buffer(f"{_BUFFER_PREFIX}{name}", tensor)
        state.kernel = kernel
        self.config.kernel_log[state.geometry.prefix] = kernel.choice

    def _int4_by_columns(self, layer: nn.Module, state: PackedLayerState) -> LayerKernel | None:
        """A wide layer's int4 kernel converted a slice of columns at a time (lower peak RSS), when it gets one."""
        cfg = self.config
        tensors = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names}
        return int4_by_columns(cfg.layout, state.geometry, tensors, bits=cfg.bits, requested=cfg.kernel,
                               dtype=state.params_dtype)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """The kernel this layer will get on the load's device, from its shapes (``loader inspect --layers``)."""
        state = self.layer_state(layer, PackedLayerState)
        cfg = self.config
        choice = plan_kernel(state.geometry, bits=cfg.bits, group_size=cfg.group_size, act_order=cfg.act_order,
                             requested=cfg.kernel, device=current_session().device)
        return choice

    def kernel(self, layer: nn.Module) -> LayerKernel:
        """The kernel chosen after loading, holding the layer's current buffers.

        ``layer.to(...)`` (or ``model.to``) replaces the buffers with new
        tensors; the kernel is then rebuilt around them, so it never keeps the
        old tensors alive or computes with them.
        """
        state = self.layer_state(layer, PackedLayerState)
        if state.kernel is None:
            raise RuntimeError(f"{state.geometry.prefix}: weights are not processed yet (no kernel chosen)")
        state.kernel = _with_layer_buffers(state.kernel, layer)
        return state.kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = self.kernel(layer).matmul(x)
        return out if bias is None else out + bias.to(out.dtype)


_BUFFER_PREFIX = "packed_"


def _with_layer_buffers(kernel: Any, layer: nn.Module, prefix: str = "") -> Any:
    """``kernel`` (or a nested record of it) with each tensor replaced by the layer's buffer of that name, when
    the two differ (the layer was moved); the same object when nothing changed."""
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(kernel)):
        value = getattr(kernel, field.name)
        if isinstance(value, torch.Tensor):
            current = layer.get_buffer(f"{_BUFFER_PREFIX}{prefix}{field.name}")
            if current is not value:
                changes[field.alias] = current
        elif attrs.has(type(value)) and not prefix:
            nested = _with_layer_buffers(value, layer, f"{field.name}_")
            if nested is not value:
                changes[field.alias] = nested
    return attrs.evolve(kernel, **changes) if changes else kernel


def _kernel_tensors(kernel: object, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor a kernel record holds (one level of nested records), named by field, for the layer's buffers."""
    found: list[tuple[str, torch.Tensor]] = []
    for field in attrs.fields(cast(Any, type(kernel))):
        value = getattr(kernel, field.name)
        if isinstance(value, torch.Tensor):
            found.append((f"{prefix}{field.name}", value))
        elif attrs.has(type(value)) and not prefix:
            found += _kernel_tensors(value, f"{field.name}_")
    return found
