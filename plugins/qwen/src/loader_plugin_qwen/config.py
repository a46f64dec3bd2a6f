"""Qwen2 and Qwen3 configs: the Llama decoder fields plus Qwen's biases, q/k norms and windows.

Sliding windows follow ``transformers``: a window applies only when
``use_sliding_window`` is true, and then to the layers ``layer_types`` marks
``"sliding_attention"`` or, in configs written before ``layer_types`` existed,
to layers ``i >= max_window_layers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from loader.errors import ConfigError
from loader.layers import MoESettings
from loader_plugin_llama import MAX_LAYERS, ConfigFields, LlamaConfig, read_decoder_config

__all__ = [
    "parse_qwen2_config",
    "parse_qwen2_moe_config",
    "parse_qwen3_config",
    "parse_qwen3_moe_config",
    "read_qwen_moe",
    "read_qwen_sliding_windows",
]

MAX_EXPERTS = 1 << 16

LAYER_TYPES = ("full_attention", "sliding_attention")
DEFAULT_MAX_WINDOW_LAYERS = 28  # transformers' default for both generations


def read_qwen_sliding_windows(fields: ConfigFields) -> tuple[int | None, ...]:
    """The attention window of each layer (empty when no layer slides)."""
    layers = fields.integer("num_hidden_layers", maximum=MAX_LAYERS)
    if not fields.boolean("use_sliding_window", False):
        return ()
    window = fields.optional_integer("sliding_window", maximum=1 << 27)
    if window is None:
        return ()
    kinds = fields.string_list("layer_types")
    if kinds is not None:
        if len(kinds) != layers:
            raise ConfigError(
                f"{fields.what}: config field 'layer_types' has {len(kinds)} entries for "
                f"num_hidden_layers={layers}"
            )
        for i, kind in enumerate(kinds):
            if kind not in LAYER_TYPES:
                raise fields.error(f"layer_types[{i}]", " or ".join(repr(k) for k in LAYER_TYPES), kind)
        return tuple(window if kind == "sliding_attention" else None for kind in kinds)
    first = fields.integer("max_window_layers", DEFAULT_MAX_WINDOW_LAYERS, minimum=0, maximum=MAX_LAYERS)
    return tuple(window if i >= first else None for i in range(layers))


def parse_qwen2_config(hf_config: Mapping[str, Any], architecture: str = "Qwen2ForCausalLM") -> LlamaConfig:
    """Qwen2 / Qwen2.5: biases on q, k and v (not on o), optional sliding windows."""
    fields = ConfigFields(hf_config, architecture)
    return read_decoder_config(
        fields, qkv_bias=True, o_proj_bias=False, sliding_windows=read_qwen_sliding_windows(fields)
    )


def parse_qwen3_config(hf_config: Mapping[str, Any], architecture: str = "Qwen3ForCausalLM") -> LlamaConfig:
    """Qwen3: per-head RMSNorm on q and k, ``attention_bias`` (default off) on q, k, v and o."""
    fields = ConfigFields(hf_config, architecture)
    bias = fields.boolean("attention_bias", False)
    return read_decoder_config(
        fields, qkv_bias=bias, o_proj_bias=bias, sliding_windows=read_qwen_sliding_windows(fields),
    )


def read_qwen_moe(fields: ConfigFields, config: LlamaConfig, *, shared_expert: bool) -> LlamaConfig:
    """``config`` with Qwen-MoE's experts: which layers are sparse, and the experts' sizes and routing.

    As ``transformers``: layer ``i`` is sparse unless it is in ``mlp_only_layers``, and only when
    ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step == 0``; the others keep a dense MLP of
    ``intermediate_size``. ``norm_topk_prob`` (default off) renormalises the chosen weights.
    The expert count is ``num_experts`` (or ``num_local_experts``, which transformers 5 writes for Qwen3-MoE).
    """
    # Hub checkpoints say num_experts; transformers 5 writes Qwen3-MoE's as num_local_experts (its attribute map)
    count_field = "num_experts" if fields.has("num_experts") or not fields.has("num_local_experts") \
        else "num_local_experts"
    experts = fields.integer(count_field, minimum=0, maximum=MAX_EXPERTS)
    if experts == 0:
        return config
    layers = config.num_hidden_layers
    step = fields.integer("decoder_sparse_step", 1, maximum=MAX_LAYERS)
    dense_only = set(fields.integer_list("mlp_only_layers", maximum=MAX_LAYERS) or ())
    dense = frozenset(i for i in range(layers) if i in dense_only or (i + 1) % step)
    settings = MoESettings(
        num_experts=experts,
        top_k=fields.integer("num_experts_per_tok", maximum=experts),
        intermediate_size=fields.integer("moe_intermediate_size", maximum=1 << 20),
        renormalize=fields.boolean("norm_topk_prob", False),
        shared_expert_intermediate_size=(
            fields.integer("shared_expert_intermediate_size", minimum=0, maximum=1 << 20) if shared_expert else 0),
    )
    return attrs.evolve(config, moe=settings, dense_layers=dense)


def parse_qwen2_moe_config(hf_config: Mapping[str, Any],
                           architecture: str = "Qwen2MoeForCausalLM") -> LlamaConfig:
    """Qwen1.5-MoE / Qwen2-MoE: Qwen2's attention (``qkv_bias``, default on), experts plus a shared expert."""
    fields = ConfigFields(hf_config, architecture)
    config = read_decoder_config(
        fields, qkv_bias=fields.boolean("qkv_bias", True), o_proj_bias=False,
        sliding_windows=read_qwen_sliding_windows(fields),
    )
    return read_qwen_moe(fields, config, shared_expert=True)


def parse_qwen3_moe_config(hf_config: Mapping[str, Any],
                           architecture: str = "Qwen3MoeForCausalLM") -> LlamaConfig:
    """Qwen3-MoE (30B-A3B, 235B-A22B): Qwen3's attention with q/k norms, experts without a shared one."""
    fields = ConfigFields(hf_config, architecture)
    return read_qwen_moe(fields, parse_qwen3_config(hf_config, architecture), shared_expert=False)
