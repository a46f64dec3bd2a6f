"""A tiny config for any causal-LM model type, shrunk from transformers' own defaults.

Every integer field that sizes the model (widths, depths, head counts, expert
counts, vocabulary) is set small by name; everything else keeps the config
class's default, so each architecture is built as transformers describes it,
only small. Per-layer lists (``layer_types``, ``mlp_only_layers``) are cut to
the layer count.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SMALL", "tiny_config"]

HIDDEN = 64
SMALL: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "hidden_dim", "embedding_dim",
                     "emb_dim", "attention_hidden_size", "lru_width", "hidden_size_global"), HIDDEN),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "n_inner", "ffn_hidden_size", "decoder_ffn_dim",
                     "encoder_ffn_dim", "dff", "d_inner", "d_ff", "dim_ff", "feed_forward_size",
                     "intermediate_size_mlp", "dense_intermediate_size", "mamba_d_ssm"), 128),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_ffn_hidden_size",
                     "shared_intermediate_size", "shared_experts_intermediate_size",
                     "moe_shared_expert_intermediate_size"), 32),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "decoder_layers", "encoder_layers", "n_layers",
                     "num_decoder_layers", "num_encoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "decoder_attention_heads", "encoder_attention_heads",
                     "num_heads", "n_heads", "num_decoder_attention_heads", "num_encoder_attention_heads",
                     "attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "num_query_groups"), 2),
    **dict.fromkeys(("head_dim", "qk_nope_head_dim", "v_head_dim", "qk_head_dim", "kv_channels", "d_head",
                     "dim_head", "attention_head_size", "attention_head_dim"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "rotary_dim", "index_head_dim"), 8),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "o_lora_rank"), 32),
    **dict.fromkeys(("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "moe_k", "num_experts_per_token"), 2),
    **dict.fromkeys(("vocab_size", "unpadded_vocab_size"), 256),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_target_positions"), 128),
}
"""Field name -> small value, applied where the default is larger."""
_HEAD_DIMS = ("head_dim", "qk_nope_head_dim", "v_head_dim", "qk_head_dim", "qk_rope_head_dim", "rotary_dim")
_HEAD_COUNTS = ("num_attention_heads", "num_key_value_heads")
_TOKENS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
_PER_LAYER = ("layer_types", "mlp_only_layers", "block_types", "layers_block_type", "hybrid_override_pattern")


def _shrink(defaults: dict[str, Any]) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    for key, value in defaults.items():
        if isinstance(value, bool):
            continue
        if key in SMALL and isinstance(value, int) and value > SMALL[key]:
            changes[key] = SMALL[key]
        elif key in _TOKENS and isinstance(value, int) and value >= SMALL["vocab_size"]:
            changes[key] = _TOKENS[key]
        elif key.endswith("_token_id") and isinstance(value, int) and value >= SMALL["vocab_size"]:
            changes[key] = SMALL["vocab_size"] - 1
        elif isinstance(value, dict) and key.endswith("config") and value:
            changes[key] = {**value, **_shrink(value)}
    _keep_equal(defaults, changes)
    layers = changes.get("num_hidden_layers", defaults.get("num_hidden_layers"))
    for key in _PER_LAYER:
        value = defaults.get(key)
        if isinstance(value, (list, str)) and isinstance(layers, int) and len(value) > layers:
            changes[key] = value[:layers]
    return changes


def _keep_equal(defaults: dict[str, Any], changes: dict[str, Any]) -> None:
    """Sizes equal by default stay equal: DeepSeek's ``head_dim`` is its ``qk_rope_head_dim`` (the smaller
    shrunk size wins), multi-head latent attention needs as many key/value heads as heads (the larger wins)."""
    for group, pick in ((_HEAD_DIMS, min), (_HEAD_COUNTS, max)):
        shrunk = [key for key in changes if key in group and isinstance(defaults.get(key), int)]
        for key in shrunk:
            equal = [changes[other] for other in shrunk if defaults[other] == defaults[key]]
            changes[key] = pick(equal)


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """A config of ``model_type`` with its defaults shrunk (see :data:`SMALL`), then ``overrides``."""
    from transformers import AutoConfig

    defaults = AutoConfig.for_model(model_type).to_dict()
    return AutoConfig.for_model(model_type, **{**_shrink(defaults), **overrides})
