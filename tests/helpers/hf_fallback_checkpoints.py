"""Tiny random checkpoints of architectures no native plugin registers, written by ``transformers``.

The fallback plugin's tests load these and compare logits with the very
``transformers`` model that wrote them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

_TOKENS = dict(vocab_size=256, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, **_TOKENS)

FALLBACK_FAMILIES: dict[str, dict[str, Any]] = {
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=128, **_TOKENS),
    "gemma": dict(_DECODER, head_dim=16),
    "phi3": dict(_DECODER),
    "olmo2": dict(_DECODER),
    "granite": dict(_DECODER, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0,
                    attention_multiplier=0.2),
    "stablelm": dict(_DECODER, partial_rotary_factor=0.25),
}
"""model_type -> config overrides; tp-friendly sizes (heads and KV heads divisible by 2)."""


def fallback_config(model_type: str, **overrides: Any) -> Any:
    """A tiny ``transformers`` config of ``model_type``."""
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **{**FALLBACK_FAMILIES.get(model_type, {}), **overrides})


def build_hf_model(config: Any, *, seed: int = 0) -> Any:
    """A ``transformers`` causal LM with random weights (norm weights and biases randomised too)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or "ln_" in name:
                param.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.1 * torch.randn_like(param))
    return model.eval()


def save_fallback_checkpoint(path: Path, model_type: str, *, seed: int = 0, max_shard_size: str = "100KB",
                             **overrides: Any) -> Any:
    """Write a random ``model_type`` checkpoint (sharded safetensors with an index) to ``path``; return the model."""
    model = build_hf_model(fallback_config(model_type, **overrides), seed=seed)
    model.save_pretrained(path, max_shard_size=max_shard_size)
    return model


def reference_logits(model: Any, input_ids: torch.Tensor) -> torch.Tensor:
    """``transformers``' own logits for ``input_ids``."""
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits
