"""Qwen2 and Qwen3 configs: the Llama decoder fields plus Qwen's biases, q/k norms and windows.

Sliding windows follow ``transformers``: a window applies only when
``use_sliding_window`` is true, and then to the layers ``layer_types`` marks
``"sliding_attention"`` or, in configs written before ``layer_types`` existed,
to layers ``i >= max_window_layers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loader.errors import ConfigError
from loader_plugin_llama import MAX_LAYERS, ConfigFields, LlamaConfig, read_decoder_config

__all__ = ["parse_qwen2_config", "parse_qwen3_config", "read_qwen_sliding_windows"]

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
