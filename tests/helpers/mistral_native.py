"""Write a ``transformers`` Mistral model in Mistral's native layout (``params.json`` + ``consolidated``).

The inverse of what loader-plugin-mistral reads: Hugging Face names become
native ones, and q/k projection rows go from the half-split rotary layout back
to the interleaved one (the inverse of ``transformers``' ``permute_for_rope``).
A model loaded from this folder must give the same logits as its HF twin.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

_LAYER_NAMES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
}
_TOP_NAMES = {"model.embed_tokens": "tok_embeddings", "model.norm": "norm", "lm_head": "output"}


def half_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows ``(head, half, pair)`` -> ``(head, pair, half)``: HF's rotary layout back to the native one."""
    rows = weight.shape[0]
    head_dim = rows // n_heads
    return (weight.reshape(n_heads, 2, head_dim // 2, *weight.shape[1:]).transpose(1, 2)
            .reshape(rows, *weight.shape[1:]).contiguous())


def native_name(hf_name: str) -> str:
    """``model.layers.3.mlp.gate_proj.weight`` -> ``layers.3.feed_forward.w1.weight``."""
    module, _, leaf = hf_name.rpartition(".")
    if module in _TOP_NAMES:
        return f"{_TOP_NAMES[module]}.{leaf}"
    _, _, index, rest = module.split(".", 3)
    return f"layers.{index}.{_LAYER_NAMES[rest]}.{leaf}"


def params_json(config: Any) -> dict[str, Any]:
    """The native ``params.json`` for a ``transformers`` ``MistralConfig``."""
    params = {
        "dim": config.hidden_size, "n_layers": config.num_hidden_layers, "head_dim": config.head_dim,
        "hidden_dim": config.intermediate_size, "n_heads": config.num_attention_heads,
        "n_kv_heads": config.num_key_value_heads, "norm_eps": config.rms_norm_eps,
        "vocab_size": config.vocab_size, "rope_theta": config.rope_parameters["rope_theta"],
    }
    if config.sliding_window is not None:
        params["sliding_window"] = config.sliding_window
    return params


def save_native_checkpoint(model: Any, path: Path) -> None:
    """Write ``model`` (a ``transformers`` ``MistralForCausalLM``) to ``path`` in the native layout."""
    config = model.config
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        tensor = tensor.detach().clone()
        if name.endswith("self_attn.q_proj.weight"):
            tensor = half_to_interleaved(tensor, config.num_attention_heads)
        elif name.endswith("self_attn.k_proj.weight"):
            tensor = half_to_interleaved(tensor, config.num_key_value_heads)
        tensors[native_name(name)] = tensor.contiguous()
    save_file(tensors, str(path / "consolidated.safetensors"))
    (path / "params.json").write_text(json.dumps(params_json(config), indent=2))
