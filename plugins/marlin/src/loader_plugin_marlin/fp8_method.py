"""The quantize method of the parallel linear layers of FP8 checkpoints (``fp8``, ``fbgemm_fp8``,
compressed-tensors ``float-quantized``).

The layer's tensors become parameters named as in the checkpoint (``weight``,
``weight_scale`` or ``weight_scale_inv``, ``input_scale``), so model plugins
route them like dense weights (``qkv_proj.weight_scale`` from
``q_proj.weight_scale`` with shard id ``"q"``); :mod:`.fp8_loading` lands each
part. After loading, :func:`~.fp8_kernels.plan_fp8_kernel` chooses the kernel
for the device, :func:`~.fp8_kernels.build_fp8_kernel` builds it, and the
kernel's tensors replace the checkpoint parameters as the layer's buffers
(``fp8_weight``, ...), so ``model.to`` moves them.

A live weight update (``loader.update_weights``) reopens the layer: the
checkpoint parameters come back, the new FP8 tensors land in them as at load,
and the second post-processing builds the same kernel and copies it into the
existing buffers (same storage) — once the layer was given its whole tensor set,
every part of a fused layer, since one part's scale alone cannot be applied to
a weight already dequantized.
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
from .layer_kernels import refill_kernel_buffers, register_kernel_buffers, with_layer_buffers
from .reopened_layers import check_whole_set, drop_reopened

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import LinearBase

    from .fp8_config import Fp8Config

__all__ = ["BUFFER_PREFIX", "Fp8LayerState", "Fp8LinearMethod"]

BUFFER_PREFIX = "fp8_"


@attrs.define
class Fp8LayerState:
    """One layer's share of the checkpoint, the tensors it holds until loaded, and then its kernel.

    :ivar weight_loader: the layer's own loader, kept to reopen the layer for an update.
    :ivar update: during an update, the parts written so far by tensor (``None`` outside one: a part ``None``
        is the whole tensor).
    """

    geometry: Fp8Geometry
    names: tuple[str, ...]
    params_dtype: torch.dtype
    weight_loader: WeightLoader
    kernel: DequantizedFp8Kernel | ScaledMmFp8Kernel | None = None
    update: dict[str, set[object]] | None = None


class Fp8LinearMethod(LinearMethodBase):
    """One FP8 linear layer: created, loaded, given a kernel and multiplied."""

    layer_state_attr = "fp8_state"
    process_weights_concurrently = True  # reads its own parameters, writes its own buffers; dequantizes in torch ops

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
        self._register_params(linear, geometry, specs, shape.weight_loader, recording=False)
        self.set_layer_state(layer, Fp8LayerState(geometry, tuple(spec.name for spec in specs), shape.params_dtype,
                                                  shape.weight_loader))

    def _register_params(self, layer: LinearBase, geometry: Fp8Geometry, specs: list[Fp8ParamSpec],
                         weight_loader: WeightLoader, *, recording: bool, device: torch.device | None = None) -> None:
        """The checkpoint tensors as parameters; ``recording``: each write noted for :meth:`check_update`."""
        for spec in specs:
            param = torch.nn.Parameter(torch.empty(spec.shape, dtype=spec.dtype, device=device), requires_grad=False)
            layout = self._layout(geometry, spec, weight_loader)
            if recording:
                assert layout.weight_loader is not None
                note = functools.partial(self._record_write, layer, spec.name, layout.weight_loader)
                layout = attrs.evolve(layout, weight_loader=note)
            set_param_layout(param, layout)
            layer.register_parameter(spec.name, param)

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
        """Choose and build the kernel, then keep its tensors as the layer's buffers instead of the parameters.

        After an update the same kernel is built from the new tensors and copied into the existing buffers.
        """
        state = self.layer_state(layer, Fp8LayerState)
        if state.kernel is not None and state.update is None:
            return
        tensors = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names}
        choice = state.kernel.choice if state.kernel is not None else self._plan(state.geometry,
                                                                                  tensors["weight"].device)
        kernel = build_fp8_kernel(choice, self.config.scheme, state.geometry, tensors, state.params_dtype)
        del tensors
        for name in state.names:
            delattr(layer, name)
        if state.kernel is not None:
            state.update = None
            refill_kernel_buffers(layer, self.kernel(layer), kernel, BUFFER_PREFIX)
            return
        register_kernel_buffers(layer, kernel, BUFFER_PREFIX)
        state.kernel = kernel
        self.config.kernel_log[state.geometry.prefix] = choice

    # -- live weight updates ----------------------------------------------------------------------------------

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """``None`` once :meth:`open_for_update` gave the layer its checkpoint tensors back as parameters."""
        if self.layer_state(layer, Fp8LayerState).update is not None:
            return None
        return (f"its quantize method {type(self).__name__} keeps it as kernel buffers and was not opened for this "
                "update (its tensors were not among the update's names)")

    def open_for_update(self, layer: nn.Module) -> None:
        """Register the checkpoint tensors' parameters again (on the buffers' device), each write recorded."""
        state = self.layer_state(layer, Fp8LayerState)
        if state.kernel is None:
            return
        if state.update is not None:  # after a probe: the same parameters, nothing written yet
            state.update = {}
            return
        specs = fp8_param_specs(self.config.scheme, state.geometry)
        self._register_params(cast("LinearBase", layer), state.geometry, specs, state.weight_loader, recording=True,
                              device=next(layer.buffers()).device)
        state.update = {}

    def _record_write(self, layer: nn.Module, name: str, weight_loader: WeightLoader, param: torch.Tensor,
                      loaded: object, shard_id: object = None) -> None:
        state = self.layer_state(layer, Fp8LayerState)
        if state.update is not None:
            state.update.setdefault(name, set()).add(shard_id)
        weight_loader(param, loaded, shard_id)

    def check_update(self, layer: nn.Module) -> None:
        """Every tensor of the layer, every part of it: the kernel is rebuilt from the whole set."""
        state = self.layer_state(layer, Fp8LayerState)
        if state.update is not None:
            check_whole_set(state.geometry.prefix, type(self).__name__, "an FP8 layer", state.names, state.update,
                            len(state.geometry.parts))

    def close_update(self, layer: nn.Module) -> None:
        """Drop the reopened parameters the update did not consume."""
        state = self.layer_state(layer, Fp8LayerState)
        if state.update is None:
            return
        drop_reopened(layer, state.names)
        state.update = None

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

