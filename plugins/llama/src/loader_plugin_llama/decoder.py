"""The Llama decoder stack, built from the core's tensor-parallel layers.

Module names mirror Hugging Face's tree with the fused projections
(``self_attn.qkv_proj``, ``mlp.gate_up_proj``), so checkpoint names map onto
``named_parameters()`` through the stacked mapping alone. Families that change
one piece subclass it: Qwen3 overrides :meth:`LlamaAttention.normalize_qk` to
add its per-head q/k norms; sliding windows and biases come from the config.

Nothing is computed in ``__init__``: the pipeline builds the model on the
``meta`` device and the rotary layer computes its tables on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from loader.layers import (
    Attention,
    GatedMLP,
    KVCache,
    QKVParallelLinear,
    RMSNorm,
    RowParallelLinear,
    SparseMoeBlock,
    VocabParallelEmbedding,
    get_rope,
)

from .config import LlamaConfig

if TYPE_CHECKING:
    from loader.layers import QuantizationConfig

__all__ = ["LlamaAttention", "LlamaDecoderLayer", "LlamaMLP", "LlamaModel"]


class LlamaAttention(nn.Module):
    """Rotary self-attention with grouped KV heads; this rank holds ``num_heads`` of them."""

    def __init__(
        self,
        config: LlamaConfig,
        layer_idx: int,
        *,
        params_dtype: torch.dtype,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size, config.head_dim, config.num_attention_heads, config.num_key_value_heads,
            bias=config.qkv_bias, params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.qkv_proj.q_size
        self.kv_size = self.qkv_proj.kv_size
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * config.head_dim, config.hidden_size,
            bias=config.o_proj_bias, params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        self.rotary_emb = get_rope(
            config.head_dim, config.max_position_embeddings, config.rope.theta, config.rope.scaling
        )
        self.attn = Attention(
            self.num_heads, self.head_dim, self.num_kv_heads, scaling=self.head_dim**-0.5,
            sliding_window=config.sliding_window(layer_idx), layer_idx=layer_idx,
        )

    def normalize_qk(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Hook between projection and rotary, on ``[batch, heads, seq, head_dim]``; Llama: identity."""
        return q, k

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, cache: KVCache | None = None
    ) -> torch.Tensor:
        batch, seq, _ = hidden.shape
        qkv = self.qkv_proj(hidden)
        if type(self).normalize_qk is LlamaAttention.normalize_qk:
            # nothing between projection and rotary: q and k heads, adjacent in qkv, are rotated as one tensor
            # (half the rotary's small ops, which dominate a decode step; the same values bit for bit)
            qk, v = qkv.split([self.q_size + self.kv_size, self.kv_size], dim=-1)
            qk = qk.view(batch, seq, self.num_heads + self.num_kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rotary_emb.rotate(positions, qk).split([self.num_heads, self.num_kv_heads], dim=1)
        else:
            q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
            q = q.view(batch, seq, self.num_heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
            q, k = self.rotary_emb(positions, *self.normalize_qk(q, k))
        v = v.view(batch, seq, self.num_kv_heads, self.head_dim).transpose(1, 2)
        out = self.attn(q, k, v, cache)
        return self.o_proj(out)  # type: ignore[no-any-return]


class LlamaMLP(GatedMLP):
    """``down(silu(gate(x)) * up(x))`` with gate and up fused in one column-parallel weight."""

    def __init__(
        self,
        config: LlamaConfig,
        *,
        params_dtype: torch.dtype,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        intermediate_size: int | None = None,
    ) -> None:
        super().__init__(
            config.hidden_size, config.intermediate_size if intermediate_size is None else intermediate_size,
            bias=config.mlp_bias, params_dtype=params_dtype, quant_config=quant_config, prefix=prefix,
        )


class LlamaDecoderLayer(nn.Module):
    """Pre-norm residual block: attention, then the MLP (a sparse MoE block on the config's MoE layers)."""

    def __init__(
        self,
        config: LlamaConfig,
        layer_idx: int,
        *,
        attention_class: type[LlamaAttention] = LlamaAttention,
        params_dtype: torch.dtype,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.self_attn = attention_class(
            config, layer_idx, params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp: nn.Module
        if config.moe is not None and config.is_moe_layer(layer_idx):
            self.mlp = SparseMoeBlock(config.hidden_size, config.moe, params_dtype=params_dtype,
                                      quant_config=quant_config, prefix=f"{prefix}.mlp")
        else:
            self.mlp = LlamaMLP(config, params_dtype=params_dtype, quant_config=quant_config, prefix=f"{prefix}.mlp")
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=params_dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, params_dtype=params_dtype)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, cache: KVCache | None = None
    ) -> torch.Tensor:
        hidden = hidden + self.self_attn(positions, self.input_layernorm(hidden), cache)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))  # type: ignore[no-any-return]


class LlamaModel(nn.Module):
    """Embedding, the decoder layers and the final norm (HF's ``model.`` subtree)."""

    def __init__(
        self,
        config: LlamaConfig,
        *,
        attention_class: type[LlamaAttention] = LlamaAttention,
        params_dtype: torch.dtype,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "model",
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, params_dtype=params_dtype, quant_config=quant_config,
            prefix=f"{prefix}.embed_tokens",
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(
                config, i, attention_class=attention_class, params_dtype=params_dtype,
                quant_config=quant_config, prefix=f"{prefix}.layers.{i}",
            )
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, params_dtype=params_dtype)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None
    ) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden = layer(positions, hidden, cache)
        return self.norm(hidden)  # type: ignore[no-any-return]
