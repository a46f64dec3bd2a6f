"""``Qwen2ForCausalLM``, ``Qwen3ForCausalLM`` and their MoE siblings on the Llama implementation.

Qwen2 differs from Llama only in its config (q/k/v biases, windows), so it
only swaps the parser. Qwen3 adds an RMSNorm over each head of q and of k
before the rotary embedding: :class:`Qwen3Attention` fills Llama's
``normalize_qk`` hook. Parameter names (``self_attn.q_norm.weight``) match
Hugging Face's, so the Llama weight loading applies unchanged. The MoE models
only read more config: the decoder puts a core ``SparseMoeBlock`` on the
layers the config makes sparse.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from loader.layers import RMSNorm
from loader_plugin_llama import LlamaAttention, LlamaConfig, LlamaForCausalLM

from .config import parse_qwen2_config, parse_qwen2_moe_config, parse_qwen3_config, parse_qwen3_moe_config

if TYPE_CHECKING:
    from loader.layers import QuantizationConfig

__all__ = ["Qwen2ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3Attention", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"]


class Qwen2ForCausalLM(LlamaForCausalLM):
    """Qwen2 / Qwen2.5: QKV bias, tied embeddings when configured, per-layer sliding windows."""

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_qwen2_config(hf_config)


class Qwen3Attention(LlamaAttention):
    """Llama attention with ``q_norm``/``k_norm``: RMSNorm over ``head_dim``, weights shared by all heads."""

    def __init__(
        self,
        config: LlamaConfig,
        layer_idx: int,
        *,
        params_dtype: torch.dtype,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(
            config, layer_idx, params_dtype=params_dtype, quant_config=quant_config, prefix=prefix
        )
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps, params_dtype=params_dtype)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps, params_dtype=params_dtype)

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.q_norm(q), self.k_norm(k)  # type: ignore[return-value]


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 dense: q/k norms, ``head_dim`` from the config, no QKV bias unless ``attention_bias``."""

    attention_class: ClassVar[type[LlamaAttention]] = Qwen3Attention

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_qwen3_config(hf_config)


class Qwen2MoeForCausalLM(Qwen2ForCausalLM):
    """Qwen1.5-MoE / Qwen2-MoE: top-k experts plus a sigmoid-gated shared expert on the sparse layers."""

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_qwen2_moe_config(hf_config)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    """Qwen3-MoE: Qwen3's attention, top-k experts (``norm_topk_prob`` renormalises), no shared expert."""

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_qwen3_moe_config(hf_config)
