"""The quantize method of compressed-tensors int8 linear layers: parameters, landing, kernel, matmul.

Parameters are named as the checkpoint names them (``weight``, ``weight_scale``, ...), so model plugins route
them like dense weights and the layer's own ``weight_loader`` splits fused tensors and narrows them to this rank:
``weight`` and per-row scales (``channel``: ``[N, 1]``, ``group``: ``[N, K / group]``) follow the output rows
and, in row-parallel layers, the input columns. A per-tensor value (``tensor`` weight scales and zero points,
static ``input_scale`` / ``input_zero_point``) has no output dim: each fused part brings its own ``[1]``, which
``load_part`` records per part, so q, k and v keep their own weight scales (a per-part vector of rows).

Static input scales of fused parts: one input feeds q, k and v, so it is quantized once. vLLM takes the largest
part's scale; here the parts' representable ranges are united (for symmetric scales that is the largest scale,
vLLM's choice; with zero points it is the range covering every part's), so no part's calibrated range clips.

Every landed tensor's dtype is checked (int8 codes and zero points, floating-point scales): a float ``weight``
would otherwise be cast silently into codes.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

import attrs
import torch

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.kernels import KernelChoice, KernelOption, choose_kernel, int8_unsupported_reason, paths_from_shapes
from loader.layers import LinearMethodBase, LinearShape, ParamLayout, RowParallelLinear, set_param_layout
from loader.models import current_session

from .grouped_int8_kernels import grouped_int8_kernel
from .int8_kernels import Int8MatmulKernel, choose_int8_kernel, plan_int8_kernel, round_input
from .kernels import FALLBACK, LayerKernel
from .layer_kernels import register_kernel_buffers, with_layer_buffers
from .quantized_weight import QuantizedWeight, default_g_idx

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import LinearBase, NarrowedPart

    from .int8_config import Int8Config

__all__ = ["Int8LayerState", "Int8LinearMethod"]

_PER_TENSOR = ("weight_scale", "weight_zero_point", "input_scale", "input_zero_point")


@attrs.define
class Int8LayerState:
    """One layer's parts on this rank (``(shard_id, offset, rows)``), its size, the per-tensor values seen per
    part, and once chosen its kernel."""

    prefix: str
    parts: tuple[tuple[object, int, int], ...]
    rows: int
    cols: int
    params_dtype: torch.dtype
    per_tensor: dict[str, dict[object, float]] = attrs.field(factory=dict)
    kernel: LayerKernel | None = None
    input_rounding: InputRounding | None = None


@attrs.frozen
class InputRounding:
    """How a W8A8 layer's input is rounded before a kernel that does not quantize it itself.

    :ivar symmetric: dynamic activations' symmetry (static ones carry their zero points).
    :ivar static: per part ``(rows, scale, zero point)`` of static activations; empty for dynamic ones.
    :ivar split_input: the layer is row-parallel over several ranks (dynamic scales are gathered).
    """

    symmetric: bool
    static: tuple[tuple[int, float, float], ...] = ()
    split_input: bool = False

    def apply(self, kernel: LayerKernel, x: torch.Tensor) -> torch.Tensor:
        """``kernel`` on the rounded input; parts with different static scales each on their own rounding."""
        if not self.static:
            return kernel.matmul(round_input(x, _EMPTY, _EMPTY, self.symmetric, self.split_input))
        distinct = {(scale, zero) for _, scale, zero in self.static}
        outs: dict[tuple[float, float], torch.Tensor] = {
            key: kernel.matmul(round_input(x, torch.tensor([key[0]]), torch.tensor([key[1]]), self.symmetric))
            for key in distinct}
        if len(outs) == 1:
            return next(iter(outs.values()))
        pieces, start = [], 0
        for rows, scale, zero in self.static:
            pieces.append(outs[scale, zero].narrow(-1, start, rows))
            start += rows
        return torch.cat(pieces, dim=-1)


_EMPTY = torch.empty(0)


@attrs.frozen
class _Spec:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    output_dim: int | None
    input_dim: int | None


class Int8LinearMethod(LinearMethodBase):
    """One int8 layer: created, landed part by part, given a kernel and multiplied."""

    layer_state_attr = "int8_state"

    def __init__(self, config: Int8Config) -> None:
        self.config = config

    def _specs(self, rows: int, cols: int) -> list[_Spec]:
        scheme = self.config.scheme
        scale_shape: tuple[int, ...]
        scale_dims: tuple[int | None, int | None]
        if scheme.strategy == "tensor":
            scale_shape, scale_dims = (1,), (None, None)
        elif scheme.strategy == "channel":
            scale_shape, scale_dims = (cols, 1), (0, None)
        else:
            scale_shape, scale_dims = (cols, rows // scheme.group_size), (0, 1)
        specs = [_Spec("weight", (cols, rows), torch.int8, 0, 1),
                 _Spec("weight_scale", scale_shape, torch.float32, *scale_dims)]
        if not scheme.symmetric:
            specs.append(_Spec("weight_zero_point", scale_shape, torch.int8, *scale_dims))
        acts = scheme.activations
        if acts is not None and not acts.dynamic:
            specs.append(_Spec("input_scale", (1,), torch.float32, None, None))
            if not acts.symmetric:
                specs.append(_Spec("input_zero_point", (1,), torch.int8, None, None))
        return specs

    def create_weights(self, layer: nn.Module, shape: LinearShape) -> None:
        linear = cast("LinearBase", layer)
        rows, cols = shape.input_size_per_partition, shape.output_size_per_partition
        group = self.config.scheme.group_size
        if group != -1 and (rows % group or shape.input_size % group):
            raise UnsupportedError(
                f"{linear.display_name}: int8 groups of {group} input columns do not tile this rank's "
                f"{rows} of {shape.input_size} columns (tensor parallel size {linear.tp_size})")
        parts = tuple((sid, linear.output_part(sid).offset, linear.output_part(sid).length)
                      for sid in linear.shard_ids())
        for spec in self._specs(rows, cols):
            param = torch.nn.Parameter(torch.empty(spec.shape, dtype=spec.dtype), requires_grad=False)
            land = self._record_per_tensor if spec.output_dim is None else self._land_rows
            set_param_layout(param, ParamLayout(weight_loader=shape.weight_loader, output_dim=spec.output_dim,
                                                input_dim=spec.input_dim,
                                                load_part=functools.partial(land, layer, spec.name)))
            layer.register_parameter(spec.name, param)
        self.set_layer_state(layer, Int8LayerState(linear.display_name, parts, rows, cols, shape.params_dtype))

    def _check_dtype(self, layer: nn.Module, name: str, part: NarrowedPart) -> None:
        """Codes and zero points must be stored as int8, scales as floats: a cast would change their meaning."""
        found = part.narrowed.dtype
        integer = name in ("weight", "weight_zero_point", "input_zero_point")
        if (found != torch.int8) if integer else not found.is_floating_point:
            expected = "int8" if integer else "a floating-point dtype"
            prefix = self.layer_state(layer, Int8LayerState).prefix
            raise CheckpointFormatError(f"{part.narrowed.describe()}: {prefix}.{name} must be stored as {expected} "
                                        f"(compressed-tensors int-quantized), found {found}")

    def _land_rows(self, layer: nn.Module, name: str, param: torch.Tensor, part: NarrowedPart) -> None:
        self._check_dtype(layer, name, part)
        param.data.narrow(0, part.offset, part.size).copy_(part.narrowed.read(param.dtype))

    def _record_per_tensor(self, layer: nn.Module, name: str, param: torch.Tensor, part: NarrowedPart) -> None:
        """Keep a ``[1]`` value for its part (``None``: the whole layer's)."""
        self._check_dtype(layer, name, part)
        value = part.narrowed.read(torch.float32).reshape(-1)
        param.data.copy_(value.to(param.dtype))
        self.layer_state(layer, Int8LayerState).per_tensor.setdefault(name, {})[part.shard_id] = float(value[0])

    def _part_values(self, state: Int8LayerState, name: str) -> list[float]:
        """Each part's per-tensor value of ``name``, in part order."""
        seen = state.per_tensor.get(name, {})
        values = [seen.get(sid, seen.get(None)) for sid, _, _ in state.parts]
        missing = [str(sid) for (sid, _, _), value in zip(state.parts, values, strict=True) if value is None]
        if missing:
            raise CheckpointFormatError(f"{state.prefix}: no {name} was loaded for part(s) {', '.join(missing)}")
        return [float(cast(float, value)) for value in values]

    def _rows_of(self, layer: nn.Module, state: Int8LayerState, name: str) -> torch.Tensor:
        """``[N, G]`` per-row values of ``name``: the loaded rows, or each part's per-tensor value repeated."""
        if self.config.scheme.strategy != "tensor":
            return cast(torch.Tensor, getattr(layer, name)).data.to(torch.float32)
        values = self._part_values(state, name)
        parts = zip(state.parts, values, strict=True)
        return torch.cat([torch.full((rows, 1), value) for (_, _, rows), value in parts])

    def _input_qparams(self, state: Int8LayerState) -> tuple[float, float] | None:
        """Static activations' ``(scale, zero point)``: the union of the parts' representable ranges."""
        acts = self.config.scheme.activations
        if acts is None or acts.dynamic:
            return None
        scales = self._part_values(state, "input_scale")
        zeros = self._part_values(state, "input_zero_point") if not acts.symmetric else [0.0] * len(scales)
        if all(zero == 0 for zero in zeros):
            return max(scales), 0.0
        low = min((-128 - zero) * scale for scale, zero in zip(scales, zeros, strict=True))
        high = max((127 - zero) * scale for scale, zero in zip(scales, zeros, strict=True))
        scale = (high - low) / 255
        return scale, float(round(-128 - low / scale))

    def quantized_weight(self, layer: nn.Module) -> QuantizedWeight:
        """This rank's weight in the plugin's internal representation (unsigned codes, zero point 128 + zp)."""
        state = self.layer_state(layer, Int8LayerState)
        codes = cast(torch.Tensor, layer.weight).data
        scales = self._rows_of(layer, state, "weight_scale")
        if self.config.scheme.symmetric:
            zeros = torch.full(scales.shape, 128, dtype=torch.int32)
        else:
            zeros = self._rows_of(layer, state, "weight_zero_point").round().to(torch.int32) + 128
        group = self.config.scheme.group_size
        return QuantizedWeight(codes=(codes.to(torch.int16) + 128).to(torch.uint8).t().contiguous(),
                               scales=scales.t().contiguous(), zeros=zeros.t().contiguous(),
                               g_idx=default_g_idx(state.rows, group), bits=8, group_size=group)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Convert the landed tensors, choose the kernel, replace the parameters by its buffers."""
        state = self.layer_state(layer, Int8LayerState)
        if state.kernel is not None:
            return
        kernel = choose_int8_kernel(self.quantized_weight(layer), self.config.scheme.activations,
                                    self._input_qparams(state), self.config.kernel, state.params_dtype)
        for name, _ in list(layer.named_parameters(recurse=False)):
            if name != "bias":
                delattr(layer, name)
        if isinstance(kernel, Int8MatmulKernel) and isinstance(layer, RowParallelLinear) and layer.tp_size > 1:
            kernel = attrs.evolve(kernel, split_input=True)
        register_kernel_buffers(layer, kernel)
        state.kernel = kernel
        state.input_rounding = self._input_rounding(layer, state, kernel)
        self.config.kernel_log[state.prefix] = kernel.choice

    def _input_rounding(self, layer: nn.Module, state: Int8LayerState, kernel: LayerKernel) -> InputRounding | None:
        """The input rounding a W8A8 layer's kernel needs (``None``: weight-only, or ``int8_mm`` does it)."""
        acts = self.config.scheme.activations
        if acts is None or isinstance(kernel, Int8MatmulKernel):
            return None
        if acts.dynamic:
            split = isinstance(layer, RowParallelLinear) and layer.tp_size > 1
            return InputRounding(acts.symmetric, split_input=split)
        scales = self._part_values(state, "input_scale")
        zeros = self._part_values(state, "input_zero_point") if not acts.symmetric else [0.0] * len(scales)
        return InputRounding(acts.symmetric, tuple((rows, scale, zero) for (_, _, rows), scale, zero
                                                   in zip(state.parts, scales, zeros, strict=True)))

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """The kernel this layer will get on the load's device, from its shapes (``loader inspect --layers``)."""
        state = self.layer_state(layer, Int8LayerState)
        scheme = self.config.scheme
        packed = KernelChoice("int8pack")
        if scheme.group_size != -1:  # the marlin chooser's answer: a grouped kernel, else the int8 kernel's reason
            groups = int8_unsupported_reason(state.rows // scheme.group_size)
            grouped = grouped_int8_kernel(state.cols, state.rows, scheme.group_size, False, state.params_dtype)
            if groups is not None:
                packed = KernelChoice(grouped) if grouped is not None else \
                    choose_kernel([KernelOption("int8pack", groups)], FALLBACK)
        if packed.kernel != FALLBACK and current_session().device.type == "cpu":  # the paths the kernel runs
            paths = paths_from_shapes(state.params_dtype, state.params_dtype)
            packed = attrs.evolve(packed, paths=paths)
        return plan_int8_kernel(scheme.activations, symmetric=scheme.symmetric, group_size=scheme.group_size,
                                k=state.rows, n=state.cols, requested=self.config.kernel, dtype=state.params_dtype,
                                device=current_session().device, packed_plan=packed)

    def kernel(self, layer: nn.Module) -> LayerKernel:
        """The kernel chosen after loading, around the layer's current buffers (rebuilt after ``layer.to``)."""
        state = self.layer_state(layer, Int8LayerState)
        if state.kernel is None:
            raise RuntimeError(f"{state.prefix}: weights are not processed yet (no kernel chosen)")
        state.kernel = with_layer_buffers(state.kernel, layer)
        return state.kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        rounding = self.layer_state(layer, Int8LayerState).input_rounding
        kernel = self.kernel(layer)
        out = kernel.matmul(x) if rounding is None else rounding.apply(kernel, x)
        return out if bias is None else out + bias.to(out.dtype)
