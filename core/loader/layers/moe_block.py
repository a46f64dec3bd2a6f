"""A sparse MoE block as the Mixtral and Qwen-MoE families build it: router, experts, optional shared expert.

``gate`` (a replicated linear: every rank needs every logit) scores the
experts, ``experts`` (:class:`~loader.layers.fused_moe.FusedMoE`) runs each
token's top-k; Qwen2-MoE adds ``shared_expert``, a gated MLP every token
passes through, scaled by ``sigmoid(shared_expert_gate(x))``. Child names are
the checkpoints' (``mlp.gate.weight``, ``mlp.shared_expert.gate_proj.weight``,
``mlp.shared_expert_gate.weight``), so a model maps them with its stacked
mapping alone. :class:`GatedMLP` is also the dense MLP of Llama-shaped models.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .activation import SiluAndMul
from .fused_moe import ExpertNames, FusedMoE
from .linear import MergedColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from .moe_settings import MoESettings

if TYPE_CHECKING:
    from .quantization import QuantizationConfig

__all__ = ["GatedMLP", "SparseMoeBlock"]


class GatedMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused in one column-parallel weight."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size, [intermediate_size] * 2, bias=bias, params_dtype=params_dtype,
            quant_config=quant_config, prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size, hidden_size, bias=bias, params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))  # type: ignore[no-any-return]


class SparseMoeBlock(nn.Module):
    """Router, experts and (Qwen2-MoE) a sigmoid-gated shared expert; ``[..., hidden]`` in and out.

    The routers stay unquantized (as in vLLM: checkpoints keep them dense); the
    experts and the shared expert get ``quant_config``'s methods.
    """

    def __init__(
        self,
        hidden_size: int,
        settings: MoESettings,
        *,
        params_dtype: torch.dtype | None = None,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.gate = ReplicatedLinear(hidden_size, settings.num_experts, params_dtype=params_dtype,
                                     prefix=f"{prefix}.gate")
        self.experts = FusedMoE(
            settings.num_experts, settings.top_k, hidden_size, settings.intermediate_size,
            renormalize=settings.renormalize, params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"{prefix}.experts", names=ExpertNames(*settings.expert_names),
        )
        self.shared_expert: GatedMLP | None = None
        self.shared_expert_gate: ReplicatedLinear | None = None
        if settings.shared_expert_intermediate_size:
            self.shared_expert = GatedMLP(
                hidden_size, settings.shared_expert_intermediate_size, params_dtype=params_dtype,
                quant_config=quant_config, prefix=f"{prefix}.shared_expert",
            )
            self.shared_expert_gate = ReplicatedLinear(hidden_size, 1, params_dtype=params_dtype,
                                                       prefix=f"{prefix}.shared_expert_gate")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])
        out = self.experts(flat, self.gate(flat))
        if self.shared_expert is not None and self.shared_expert_gate is not None:
            out = out + torch.sigmoid(self.shared_expert_gate(flat)) * self.shared_expert(flat)
        return out.reshape(shape)
