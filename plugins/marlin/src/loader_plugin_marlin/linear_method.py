"""The GPTQ quantize method of the parallel linear layers.

Each quantized layer holds this rank's GPTQ tensors as parameters, named as
in the checkpoint so model plugins route them like dense weights
(``qkv_proj.qweight`` from ``q_proj.qweight`` with shard id ``"q"``):

* ``qweight`` int32 ``[K/p, N]`` — packed along the input dim (``packed_dim``
  0); row-parallel layers take their input rows, column-parallel and fused
  layers their output columns, through the layer's own ``weight_loader``;
* ``qzeros`` int32 ``[G, N/p]`` — packed along the output dim, so fused parts
  and column shards must start on a whole word (the core refuses otherwise);
* ``scales`` float32 ``[G, N]`` — kept in float32 so 16-bit checkpoint scales
  stay exact whatever the load's dtype;
* ``g_idx`` int32 ``[K]`` — the group of each input row.

Under row parallelism without act-order each rank holds its own groups (the
split must fall on a group boundary); with act-order a rank's rows may use
any group, so ``scales``/``qzeros`` stay whole on every rank, as vLLM does.
After loading, the tensors are unpacked into a
:class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`, checked,
and handed to :func:`~loader_plugin_marlin.kernels.choose_kernel`; the
checkpoint-layout parameters are then dropped and the kernel's tensors
become the layer's buffers.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, cast

import attrs
import torch

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.layers.param_layout import ParamLayout, set_param_layout
from loader.layers.quantization import LinearMethodBase, WeightLoader

from .config import GPTQConfig
from .gptq_format import check_g_idx, gptq_to_quantized
from .kernels import LayerKernel, choose_kernel
from .quantized_weight import QuantizedWeight

if TYPE_CHECKING:
    from torch import nn

    from loader.layers.linear import LinearBase
    from loader.layers.shard_loading import NarrowedPart

__all__ = ["GPTQLayerState", "GPTQLinearMethod"]

_CHECKPOINT_PARAMS = ("qweight", "qzeros", "scales", "g_idx")


@attrs.define
class GPTQLayerState:
    """What one layer's method needs after loading: its groups on this rank and the g_idx parts seen."""

    prefix: str
    groups: int
    first_group: int
    whole_input: bool
    params_dtype: torch.dtype
    g_idx_parts: list[object] = attrs.field(factory=list)
    kernel: LayerKernel | None = None


def _state(layer: nn.Module) -> GPTQLayerState:
    state = getattr(layer, "gptq_state", None)
    if not isinstance(state, GPTQLayerState):
        raise TypeError(f"{type(layer).__name__} was not set up by GPTQLinearMethod.create_weights")
    return state


def _tensor(layer: nn.Module, name: str) -> torch.Tensor:
    return cast(torch.Tensor, getattr(layer, name)).data


class GPTQLinearMethod(LinearMethodBase):
    """GPTQ weights for one linear layer: created, loaded, checked, given a kernel and multiplied."""

    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        weight_loader: WeightLoader,
        **extra: Any,
    ) -> None:
        cfg = self.config
        linear = cast("LinearBase", layer)
        what = linear.prefix or type(layer).__name__
        pack, rows, cols = cfg.pack_factor, input_size_per_partition, sum(output_partition_sizes)
        split = rows != input_size
        tp = f"tensor parallel size {linear.tp_size}"
        if rows % pack:
            raise UnsupportedError(
                f"{what}: {rows} input rows per rank ({tp}) are not whole int32 words of {pack} {cfg.bits}-bit "
                f"codes, so qweight cannot be split there"
            )
        for part in output_partition_sizes:
            if part % pack:
                raise UnsupportedError(
                    f"{what}: {part} output columns of a part per rank ({tp}) are not whole int32 words of "
                    f"{pack} {cfg.bits}-bit zero points, so qzeros cannot be split there"
                )
        group = input_size if cfg.group_size == -1 else cfg.group_size
        shard_groups = split and cfg.group_size != -1 and not cfg.desc_act
        if shard_groups and rows % group:
            raise UnsupportedError(
                f"{what}: {tp} gives each rank {rows} of the {input_size} input rows, which cuts a group of "
                f"{group} rows; GPTQ scales and zero points cannot be split inside a group"
            )
        groups = rows // group if shard_groups else -(-input_size // group)
        scale_input_dim = 0 if shard_groups else None

        def add(name: str, shape: tuple[int, ...], dtype: torch.dtype, layout: ParamLayout) -> None:
            param = torch.nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
            set_param_layout(param, layout)
            layer.register_parameter(name, param)

        add("qweight", (rows // pack, cols), torch.int32, ParamLayout(
            weight_loader=weight_loader, output_dim=1, input_dim=0, packed_dim=0, pack_factor=pack))
        add("qzeros", (groups, cols // pack), torch.int32, ParamLayout(
            weight_loader=weight_loader, output_dim=1, input_dim=scale_input_dim, packed_dim=1, pack_factor=pack))
        add("scales", (groups, cols), torch.float32, ParamLayout(
            weight_loader=weight_loader, output_dim=1, input_dim=scale_input_dim))
        add("g_idx", (rows,), torch.int32, ParamLayout(
            weight_loader=weight_loader, input_dim=0, load_part=functools.partial(self._load_g_idx, linear)))
        layer.gptq_state = GPTQLayerState(  # type: ignore[assignment]
            prefix=what, groups=groups, first_group=linear.tp_rank * groups if shard_groups else 0,
            whole_input=not split, params_dtype=params_dtype,
        )

    def _load_g_idx(self, layer: LinearBase, param: torch.Tensor, part: NarrowedPart) -> None:
        """Copy this rank's ``g_idx``; every part of a fused layer must bring the same one (one input, one order)."""
        state = _state(layer)
        values = part.narrowed.read(torch.int32)
        if state.g_idx_parts and not torch.equal(values, param.data):
            raise CheckpointFormatError(
                f"{part.narrowed.describe()}: {state.prefix}.g_idx of part {part.shard_id!r} differs from part "
                f"{state.g_idx_parts[0]!r}; the fused parts share one input and must share one g_idx"
            )
        param.data.copy_(values)
        state.g_idx_parts.append(part.shard_id)

    def quantized_weight(self, layer: nn.Module) -> QuantizedWeight:
        """This rank's weight in the internal representation, checked (call before the kernel is chosen)."""
        state, cfg = _state(layer), self.config
        g_idx = check_g_idx(_tensor(layer, "g_idx"), state.groups, cfg.group_size, act_order=cfg.desc_act,
                            whole=state.whole_input, first_group=state.first_group, what=state.prefix)
        return gptq_to_quantized(_tensor(layer, "qweight"), _tensor(layer, "qzeros"), _tensor(layer, "scales"),
                                 g_idx, bits=cfg.bits, group_size=cfg.group_size,
                                 zeros_minus_one=cfg.zeros_stored_minus_one)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Unpack and check the checkpoint tensors, choose the kernel, replace the parameters by its buffers."""
        state = _state(layer)
        if state.kernel is not None:
            return
        kernel = choose_kernel(self.quantized_weight(layer), self.config.kernel, state.params_dtype)
        for name in _CHECKPOINT_PARAMS:
            delattr(layer, name)
        for name, tensor in _kernel_tensors(kernel):
            layer.register_buffer(f"gptq_{name}", tensor)
        state.kernel = kernel
        self.config.kernel_log[state.prefix] = kernel.choice

    def kernel(self, layer: nn.Module) -> LayerKernel:
        """The kernel chosen after loading."""
        kernel = _state(layer).kernel
        if kernel is None:
            raise RuntimeError(f"{_state(layer).prefix}: weights are not processed yet (no kernel chosen)")
        return kernel

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        out = self.kernel(layer).matmul(x)
        return out if bias is None else out + bias.to(out.dtype)


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
