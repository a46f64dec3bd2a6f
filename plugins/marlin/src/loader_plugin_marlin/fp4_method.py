"""The quantize method of the parallel linear layers of FP4 checkpoints (NVFP4, MXFP4).

The layer's tensors become parameters named as in the checkpoint
(:class:`~.fp4_format.Fp4Scheme`: ``weight_packed``/``weight``,
``weight_scale``, the global scale, ModelOpt's ``input_scale``), so model
plugins route them like dense weights. The packed codes and group scales go
through the layer's own ``weight_loader`` (fused q/k/v and gate/up split,
column-parallel rows and row-parallel input columns narrowed to this rank) and
land here with a dtype check; the per-tensor scales keep one entry per fused
part, since each part was quantized with its own global scale.

A row-parallel rank must hold whole groups of input columns (16 for NVFP4, 32
for MXFP4): a tensor-parallel size that cuts a group is refused by name before
anything is read.

After loading, the codes and scales are decoded once into the load's dtype
(:func:`~.fp4_format.dequantize_fp4`) and multiplied with ``F.linear``: there
is no FP4 matmul on the CPU. Decoding costs once per load about 0.15-0.4 s per
2048x8192 layer (16.8 M weights, float32 or bfloat16, NVFP4 or MXFP4; measured
on a 2-core AMD EPYC with 1 or 2 threads, under other load) and holds a float32
copy of the layer and an int64 index per byte while it runs. The kernel chosen
(:func:`~.fp4_kernels.plan_fp4_kernel`) is recorded per layer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch
import torch.nn.functional as F

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.layers import LinearMethodBase, LinearShape, ParamLayout, set_param_layout
from loader.models import current_session

from .fp4_activations import round_input_to_nvfp4
from .fp4_format import dequantize_fp4
from .fp4_kernels import device_capability, plan_fp4_kernel
from .layer_kernels import register_kernel_buffers, with_layer_buffers

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import LinearBase, NarrowedPart
    from loader.weights import CheckpointTensor

    from .fp4_config import Fp4Config
    from .fp4_format import Fp4Scheme

__all__ = ["BUFFER_PREFIX", "DequantizedFp4Kernel", "Fp4Geometry", "Fp4LayerState", "Fp4LinearMethod"]

BUFFER_PREFIX = "fp4_"


@attrs.frozen
class Fp4Geometry:
    """This rank's share of one layer: each fused part's rows here (in order) and the input columns."""

    prefix: str
    shard_ids: tuple[object, ...]
    part_rows: tuple[int, ...]
    cols: int
    input_size: int

    @property
    def rows(self) -> int:
        return sum(self.part_rows)


@attrs.frozen
class DequantizedFp4Kernel:
    """The decoded weight ``[N, K]`` in the load's dtype, multiplied with ``F.linear``.

    :ivar input_scales: float32 ``[parts]``, each fused part's static ``input_global_scale`` when the checkpoint
        rounds inputs to NVFP4 (:func:`~.fp4_activations.round_input_to_nvfp4`); ``None``: inputs as they come.
    :ivar part_rows: each part's rows of :attr:`weight` (parts whose input scales differ see their own rounding).
    """

    weight: torch.Tensor
    input_scales: torch.Tensor | None = None
    part_rows: tuple[int, ...] = ()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight.to(x.dtype)
        scales = self.input_scales
        if scales is None:
            return F.linear(x, weight)
        if bool((scales == scales[0]).all()):
            return F.linear(round_input_to_nvfp4(x, scales[0]), weight)
        outputs = [F.linear(round_input_to_nvfp4(x, scales[index]), part)
                   for index, part in enumerate(weight.split(list(self.part_rows)))]
        return torch.cat(outputs, dim=-1)


@attrs.define
class Fp4LayerState:
    """One layer's geometry, the checkpoint tensors it holds until loaded, and then its kernel."""

    geometry: Fp4Geometry
    names: tuple[str, ...]
    params_dtype: torch.dtype
    kernel: DequantizedFp4Kernel | None = None


def fp4_geometry(layer: LinearBase, shape: LinearShape, scheme: Fp4Scheme) -> Fp4Geometry:
    """This rank's share of ``layer``; a row-parallel split that cuts a group of input columns is refused."""
    group = scheme.group_size
    geometry = Fp4Geometry(
        prefix=layer.display_name, shard_ids=tuple(layer.shard_ids()),
        part_rows=tuple(layer.output_part(shard_id).length for shard_id in layer.shard_ids()),
        cols=shape.input_size_per_partition, input_size=shape.input_size)
    if geometry.input_size % group:
        raise UnsupportedError(
            f"{geometry.prefix}: {scheme.kind.upper()} quantizes groups of {group} input columns, but the layer "
            f"has {geometry.input_size}")
    if geometry.cols % group:
        raise UnsupportedError(
            f"{geometry.prefix}: tensor parallel size {layer.tp_size} gives each rank {geometry.cols} of "
            f"{geometry.input_size} input columns, which cuts a group of {group} ({scheme.kind.upper()} scales "
            f"one per group); the columns per rank must be a multiple of {group}")
    return geometry


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def land_checked(what: str, dtype: torch.dtype, param: torch.Tensor, part: NarrowedPart) -> None:
    """Copy this rank's rows of a packed-codes or group-scales part, refusing any other stored dtype."""
    loaded = part.narrowed
    if loaded.dtype != dtype:
        raise CheckpointFormatError(
            f"{loaded.describe()}: {what} must be stored as {_dtype_name(dtype)}, found {_dtype_name(loaded.dtype)}")
    loaded.read_into(param.data.narrow(0, part.offset, part.size))


def land_part_scalar(geometry: Fp4Geometry, name: str, param: torch.Tensor, loaded: CheckpointTensor,
                     shard_id: object = None) -> None:
    """A per-tensor float32 value (``[]`` or ``[1]``) at its part's index; without a part, at every index."""
    what = f"{geometry.prefix}.{name}"
    if loaded.numel() != 1:
        raise CheckpointFormatError(
            f"{loaded.describe()}: {what} is one value per tensor (shape [] or [1]), found shape "
            f"{list(loaded.shape)}")
    if loaded.dtype != torch.float32:
        raise CheckpointFormatError(
            f"{loaded.describe()}: {what} must be stored as float32, found {_dtype_name(loaded.dtype)}")
    value = loaded.read(torch.float32).reshape(())
    if shard_id is None:
        param.data.fill_(value)
    else:
        param.data[geometry.shard_ids.index(shard_id)] = value


class Fp4LinearMethod(LinearMethodBase):
    """One FP4 linear layer: created, loaded, decoded once, multiplied."""

    layer_state_attr = "fp4_state"

    def __init__(self, config: Fp4Config) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        linear = cast("LinearBase", layer)
        scheme = self.config.scheme
        geometry = fp4_geometry(linear, shape, scheme)
        rows, cols, parts = geometry.rows, geometry.cols, len(geometry.part_rows)
        loader = shape.weight_loader
        codes = f"{geometry.prefix}.{scheme.packed_name} (E2M1 codes, two per byte)"
        scales = f"{geometry.prefix}.weight_scale ({scheme.kind.upper()} group scales, {scheme.scale_type})"
        params = {
            scheme.packed_name: (torch.empty(rows, cols // 2, dtype=torch.uint8), ParamLayout(
                weight_loader=loader, output_dim=0, input_dim=1, packed_dim=1, pack_factor=2,
                load_part=functools.partial(land_checked, codes, torch.uint8))),
            "weight_scale": (torch.empty(rows, cols // scheme.group_size, dtype=scheme.scale_dtype), ParamLayout(
                weight_loader=loader, output_dim=0, input_dim=1,
                load_part=functools.partial(land_checked, scales, scheme.scale_dtype))),
        }
        for name in (scheme.global_name, scheme.input_name):
            if name is not None:
                params[name] = (torch.empty(parts, dtype=torch.float32), ParamLayout(
                    weight_loader=functools.partial(land_part_scalar, geometry, name)))
        for name, (tensor, layout) in params.items():
            param = torch.nn.Parameter(tensor, requires_grad=False)
            set_param_layout(param, layout)
            linear.register_parameter(name, param)
        self.set_layer_state(layer, Fp4LayerState(geometry, tuple(params), shape.params_dtype))

    def _plan(self, geometry: Fp4Geometry, device: torch.device, dtype: torch.dtype) -> KernelChoice:
        return plan_fp4_kernel(self.config.scheme, device.type, device_capability(device), dtype,
                               activations_quantized=self.config.activations_quantized)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """The kernel this layer will get on the load's device, from its shapes (``loader inspect --layers``)."""
        state = self.layer_state(layer, Fp4LayerState)
        return self._plan(state.geometry, current_session().device, state.params_dtype)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Decode the codes and scales into the load's dtype; the decoded weight replaces the parameters."""
        state = self.layer_state(layer, Fp4LayerState)
        if state.kernel is not None:
            return
        tensors = {name: cast(torch.Tensor, getattr(layer, name)).data for name in state.names}
        device = tensors[self.config.scheme.packed_name].device
        choice = self._plan(state.geometry, device, state.params_dtype)
        part_rows = torch.tensor(state.geometry.part_rows, dtype=torch.int64, device=device)
        scheme = self.config.scheme
        input_scales = tensors[scheme.input_name].clone() if scheme.input_applied and scheme.input_name else None
        kernel = DequantizedFp4Kernel(dequantize_fp4(scheme, tensors, part_rows, state.params_dtype), input_scales,
                                      state.geometry.part_rows)
        del tensors
        for name in state.names:
            delattr(layer, name)
        register_kernel_buffers(layer, kernel, BUFFER_PREFIX)
        state.kernel = kernel
        self.config.kernel_log[state.geometry.prefix] = choice

    def kernel(self, layer: nn.Module) -> DequantizedFp4Kernel:
        """The decoded weight, around the layer's current buffer (rebuilt after ``layer.to``)."""
        state = self.layer_state(layer, Fp4LayerState)
        if state.kernel is None:
            raise RuntimeError(f"{state.geometry.prefix}: weights are not processed yet (no kernel chosen)")
        state.kernel = with_layer_buffers(state.kernel, layer, BUFFER_PREFIX)
        return state.kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = self.kernel(layer).matmul(x)
        return out if bias is None else out + bias.to(out.dtype)
