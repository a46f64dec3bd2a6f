"""Tiny random Hugging Face checkpoints written by ``transformers`` for tests.

Every family the project supports has a preset here; tests pass overrides for
the case they check (GQA, rope scaling, tied embeddings, one KV head, ...).
``transformers`` is a test-only dependency: the loader itself never imports it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(
        architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "mistral": dict(
        architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None,
    ),
    "qwen2": dict(
        architectures=["Qwen2ForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True, use_sliding_window=False,
    ),
    "qwen3": dict(
        architectures=["Qwen3ForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    ),
    # mixture-of-experts: 4 experts of 32, 2 chosen; per-expert tensors on disk, as transformers writes them
    "mixtral": dict(
        architectures=["MixtralForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=32,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, sliding_window=None,
        num_local_experts=4, num_experts_per_tok=2,
    ),
    "qwen2_moe": dict(
        architectures=["Qwen2MoeForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=96,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False, use_sliding_window=False,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48,
        norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[1],
    ),
    "qwen3_moe": dict(
        architectures=["Qwen3MoeForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
    ),
}

_CONFIG_CLASSES = {"llama": "LlamaConfig", "mistral": "MistralConfig", "qwen2": "Qwen2Config",
                   "qwen3": "Qwen3Config", "mixtral": "MixtralConfig", "qwen2_moe": "Qwen2MoeConfig",
                   "qwen3_moe": "Qwen3MoeConfig"}
_MODEL_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "mixtral": "MixtralForCausalLM",
                  "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}


def tiny_config(family: str, **overrides: Any) -> Any:
    """A ``transformers`` config for ``family`` with the preset's tiny sizes and ``overrides``."""
    import transformers

    kwargs = {**FAMILIES[family], **overrides}
    return getattr(transformers, _CONFIG_CLASSES[family])(**kwargs)


def build_model(family: str, config: Any = None, *, seed: int = 0, dtype: torch.dtype = torch.float32) -> Any:
    """A ``transformers`` model with random weights (norms randomised too, so they are tested)."""
    import transformers

    config = config if config is not None else tiny_config(family)
    torch.manual_seed(seed)
    model = getattr(transformers, _MODEL_CLASSES[family])(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
            elif name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):
                param.copy_(torch.randn_like(param))  # routers start at zero: every expert would tie
    return model.to(dtype).eval()


def save_checkpoint(
    family: str,
    path: Path,
    *,
    config: Any = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    max_shard_size: str | int = "40KB",
    safe_serialization: bool = True,
) -> Any:
    """Write a random ``family`` checkpoint to ``path`` in several shards with an index; return the model."""
    model = build_model(family, config, seed=seed, dtype=dtype)
    model.save_pretrained(path, max_shard_size=max_shard_size, safe_serialization=safe_serialization)
    return model


def reference_logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """Logits of the ``transformers`` model on ``input_ids`` (no cache)."""
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``‖actual − expected‖ / ‖expected‖`` in float64."""
    a = actual.double()
    e = expected.double()
    return float((a - e).norm() / e.norm())
