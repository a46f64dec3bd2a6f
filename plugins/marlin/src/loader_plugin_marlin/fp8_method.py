"""The quantize method of the parallel linear layers of FP8 checkpoints (``fp8``, ``fbgemm_fp8``,
compressed-tensors ``float-quantized``).

The layer's tensors become parameters named as in the checkpoint (``weight``,
``weight_scale`` or ``weight_scale_inv``, ``input_scale``), so model plugins
route them like dense weights (``qkv_proj.weight_scale`` from
``q_proj.weight_scale`` with shard id ``"q"``); :mod:`.fp8_loading` lands each
part. After loading, :func:`~.fp8_kernels.plan_fp8_kernel` chooses the kernel
for the device, :func:`~.fp8_kernels.build_fp8_kernel` builds it, and the
kernel's tensors replace the checkpoint parameters as the layer's buffers
(``fp8_weight``, ...), so ``model.to`` moves them. A live weight update is refused
(the base method's answer): the FP8 weight is gone once dequantized.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch

from loader.errors import UnsupportedError
from loader.layers import LinearMethodBase, LinearShape, ParamLayout, WeightLoader, set_param_layout
from loader.models import current_session

from .fp8_kernels import DequantizedFp8Kernel, ScaledMmFp8Kernel, build_fp8_kernel, device_capability, plan_fp8_kernel
from .fp8_loading import land_block_scales, land_fp8_weight, land_part_scalar, land_row_scales
from .fp8_scheme import Fp8Geometry, Fp8ParamSpec, fp8_geometry, fp8_param_specs
from .layer_kernels import register_kernel_buffers, with_layer_buffers

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import LinearBase

    from .fp8_config import Fp8Config

__all__ = ["BUFFER_PREFIX", "Fp8LayerState", "Fp8LinearMethod"]

BUFFER_PREFIX = "fp8_"


@attrs.define
class Fp8LayerState:
    """One layer's share of the checkpoint, the tensors it holds until loaded, and then its kernel."""

    geometry: Fp8Geometry
    names: tuple[str, ...]
    params_dtype: torch.dtype
    kernel: DequantizedFp8Kernel | ScaledMmFp8Kernel | None = None


class Fp8LinearMethod(LinearMethodBase):
    """One FP8 linear layer: created, loaded, given a kernel and multiplied."""

    layer_state_attr = "fp8_state"

    def __init__(self, config: Fp8Config) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        linear = cast("LinearBase", layer)
        scheme = self.config.scheme
        geometry = fp8_geometry(linear, shape, scheme)
        acts = scheme.activations
        if acts is not None and acts.emulated_on_cpu and acts.group_size and geometry.cols % acts.group_size:
            raise UnsupportedError(
                f"{geometry.prefix}: activations are quantized in groups of {acts.group_size} input columns, but "
                f"this rank's input has {geometry.cols} columns (of {geometry.input_size})")
        specs = fp8_param_specs(scheme, geometry)
        for spec in specs:
            param = torch.nn.Parameter(torch.empty(spec.shape, dtype=spec.dtype), requires_grad=False)
            set_param_layout(param, self._layout(geometry, spec, shape.weight_loader))
            linear.register_parameter(spec.name, param)
        self.set_layer_state(layer, Fp8LayerState(geometry, tuple(spec.name for spec in specs), shape.params_dtype))

    @staticmethod
    def _layout(geometry: Fp8Geometry, spec: Fp8ParamSpec, weight_loader: WeightLoader) -> ParamLayout:
        """The weight and per-row scales through the layer's loader; per-part values and block grids by ours."""
        if spec.role == "weight":
            return ParamLayout(weight_loader=weight_loader, output_dim=0, input_dim=1,
                               load_part=functools.partial(land_fp8_weight, geometry.prefix))
        if spec.role == "rows":
            return ParamLayout(weight_loader=weight_loader, output_dim=0,
                               load_part=functools.partial(land_row_scales, f"{geometry.prefix}.{spec.name}"))
        if spec.role == "part_scalar":
            return ParamLayout(weight_loader=functools.partial(land_part_scalar, geometry, spec.name))
        return ParamLayout(weight_loader=functools.partial(land_block_scales, geometry, spec.name))

    def _plan(self, geometry: Fp8Geometry, device: torch.device) -> KernelChoice:
        capability = device_capability(device) if device.type == "cuda" else None
        return plan_fp8_kernel(self.config.scheme, geometry, self.config.kernel, device, capability)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """The kernel this layer will get on the load's device, from its shapes (``loader inspect --layers``)."""
        return self._plan(self.layer_state(layer, Fp8LayerState).geometry, current_session().device)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Choose and build the kernel, then keep its tensors as the layer's buffers instead of the parameters."""
        state = self.layer_state(layer, Fp8LayerState)
        if state.kernel is not None:
            return
        tensors = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names}
        choice = self._plan(state.geometry, tensors["weight"].device)
        kernel = build_fp8_kernel(choice, self.config.scheme, state.geometry, tensors, state.params_dtype)
        del tensors
        for name in state.names:
            delattr(layer, name)
        register_kernel_buffers(layer, kernel, BUFFER_PREFIX)
        state.kernel = kernel
        self.config.kernel_log[state.geometry.prefix] = choice

    def kernel(self, layer: nn.Module) -> DequantizedFp8Kernel | ScaledMmFp8Kernel:
        """The kernel built after loading, around the layer's current buffers (rebuilt after ``layer.to``)."""
        state = self.layer_state(layer, Fp8LayerState)
        if state.kernel is None:
            raise RuntimeError(f"{state.geometry.prefix}: weights are not processed yet (no kernel chosen)")
        state.kernel = with_layer_buffers(state.kernel, layer, BUFFER_PREFIX)
        return state.kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = self.kernel(layer).matmul(x)
        return out if bias is None else out + bias.to(out.dtype)
