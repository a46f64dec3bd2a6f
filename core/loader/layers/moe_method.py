"""The quantization seam of a fused-experts layer: :class:`FusedMoEMethodBase` (vLLM's shape).

A :class:`~loader.layers.fused_moe.FusedMoE` layer asks its quantization
config for a method exactly as a linear layer does
(``get_quant_method(layer, prefix)``, the layer being the ``FusedMoE``); the
method registers the experts' parameters and runs them. Parameters are 3-D,
experts outermost, and named ``w13_*`` (gate and up of every local expert,
gate rows first) or ``w2_*`` (down): the layer's ``weight_loader`` lands a
checkpoint tensor by that prefix, narrowing it to this rank's rows and
columns through the parameter's :class:`~loader.layers.param_layout.ParamLayout`,
whose dimensions count the expert dimension too (``w13_weight`` is
``output_dim=1, input_dim=2``). A checkpoint's ``experts.3.gate_proj.qweight``
thus lands in ``w13_qweight`` of expert 3 with no model code knowing about it.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, cast

import attrs
import torch
import torch.nn.functional as F

from ..errors import PluginError
from ..kernels.choice import KernelChoice
from .moe_dispatch import run_chosen_experts
from .param_layout import ParamLayout, WeightLoader, set_param_layout
from .quantization import LinearMethodBase, QuantizeMethodBase, method_name_of, quant_method_asked

if TYPE_CHECKING:
    from torch import nn

    from .quantization import QuantizationConfig

__all__ = ["ExpertsShape", "FusedMoEMethodBase", "UnquantizedFusedMoEMethod", "fused_moe_method_for"]


@attrs.frozen
class ExpertsShape:
    """What a fused-experts layer tells its method's :meth:`~FusedMoEMethodBase.create_weights`.

    :ivar num_local_experts: the experts this rank holds (the parameters' first dimension).
    :ivar hidden_size: the model's hidden size (gate/up input, down output).
    :ivar intermediate_size_per_partition: this rank's slice of one expert's intermediate size.
    :ivar intermediate_size: one expert's full intermediate size.
    :ivar params_dtype: the dtype of unquantized parameters.
    :ivar weight_loader: the layer's expert-aware loader, to put in each parameter's layout.
    """

    num_local_experts: int
    hidden_size: int
    intermediate_size_per_partition: int
    intermediate_size: int
    params_dtype: torch.dtype
    weight_loader: WeightLoader


class FusedMoEMethodBase(QuantizeMethodBase):
    """How a fused-experts layer's parameters are created and its chosen experts run."""

    @abc.abstractmethod
    def create_weights(self, layer: nn.Module, shape: ExpertsShape) -> None:
        """Register ``w13_*`` and ``w2_*`` parameters on ``layer``, experts outermost, sized by ``shape``.

        Put ``shape.weight_loader`` in each parameter's layout; ``output_dim``,
        ``input_dim`` and ``packed_dim`` count the leading expert dimension.
        """

    @abc.abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,  # type: ignore[override]
              topk_ids: torch.Tensor) -> torch.Tensor:
        """``[tokens, hidden]`` output of this rank's experts (a partial sum the layer reduces over ranks).

        :param x: ``[tokens, hidden]``.
        :param topk_weights: ``[tokens, top_k]`` float32 routing weights.
        :param topk_ids: ``[tokens, top_k]`` indices into this rank's experts, ``-1`` for experts held elsewhere
            (run them with :func:`~loader.layers.moe_dispatch.run_chosen_experts`).
        """


class UnquantizedFusedMoEMethod(FusedMoEMethodBase):
    """Dense experts: ``w13_weight [experts, 2 * intermediate, hidden]`` and ``w2_weight [experts, hidden, inter]``."""

    def create_weights(self, layer: nn.Module, shape: ExpertsShape) -> None:
        experts, inter, hidden = shape.num_local_experts, shape.intermediate_size_per_partition, shape.hidden_size
        w13 = torch.nn.Parameter(torch.empty(experts, 2 * inter, hidden, dtype=shape.params_dtype),
                                 requires_grad=False)
        w2 = torch.nn.Parameter(torch.empty(experts, hidden, inter, dtype=shape.params_dtype), requires_grad=False)
        set_param_layout(w13, ParamLayout(weight_loader=shape.weight_loader, output_dim=1, input_dim=2))
        set_param_layout(w2, ParamLayout(weight_loader=shape.weight_loader, output_dim=1, input_dim=2))
        layer.register_parameter("w13_weight", w13)
        layer.register_parameter("w2_weight", w2)

    def layer_plan(self, layer: nn.Module) -> KernelChoice | None:
        """Dense experts: the checkpoint (or the quantization's skip list) keeps them unquantized."""
        return KernelChoice("dense")

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        """Dense experts are plain copies: an update writes them in place."""
        return None

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,  # type: ignore[override]
              topk_ids: torch.Tensor) -> torch.Tensor:
        w13 = cast(torch.Tensor, layer.w13_weight)
        w2 = cast(torch.Tensor, layer.w2_weight)

        def expert(index: int, rows: torch.Tensor) -> torch.Tensor:
            gate, up = F.linear(rows, w13[index]).chunk(2, dim=-1)
            return F.linear(F.silu(gate) * up, w2[index])

        return run_chosen_experts(x, topk_weights, topk_ids, w13.shape[0], expert)


def fused_moe_method_for(quant_config: QuantizationConfig | None, layer: nn.Module,
                         prefix: str) -> FusedMoEMethodBase:
    """The config's method for a fused-experts layer; dense when there is no config, it skips the layer or
    answers ``None``.

    A linear method (a config written before experts existed answering every
    layer alike) cannot hold experts: that, and any other wrong answer, is a
    :class:`~loader.errors.PluginError` naming the quantization and saying experts are not supported.
    """
    method = quant_method_asked(quant_config, layer, prefix)
    if method is None:
        return UnquantizedFusedMoEMethod()
    if isinstance(method, FusedMoEMethodBase):
        return method
    name = method_name_of(quant_config)
    if isinstance(method, LinearMethodBase):
        raise PluginError(
            f"quantization {name!r} does not support mixture-of-experts layers: it gave the linear method "
            f"{type(method).__name__} for the experts {prefix!r}, which need a FusedMoEMethodBase"
        )
    raise PluginError(f"quantization {name!r} gave {type(method).__name__} for the experts {prefix!r}; "
                      "experts need a FusedMoEMethodBase")
