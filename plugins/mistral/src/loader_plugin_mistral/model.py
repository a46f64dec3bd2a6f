"""``MistralForCausalLM``: the Llama implementation with a sliding window, from either layout.

A checkpoint in Hugging Face's layout loads exactly as Llama does; one in
Mistral's native layout (config translated from ``params.json``) arrives
already renamed and un-interleaved by its format's renaming step
(:mod:`loader_plugin_mistral.native_layout`), so the model sees one layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loader_plugin_llama import MAX_LAYERS, ConfigFields, LlamaConfig, LlamaForCausalLM, read_decoder_config

__all__ = ["MistralForCausalLM", "parse_mistral_config"]


def parse_mistral_config(
    hf_config: Mapping[str, Any], architecture: str = "MistralForCausalLM"
) -> LlamaConfig:
    """Mistral: Llama's fields, no biases, ``sliding_window`` (when set) on every layer."""
    fields = ConfigFields(hf_config, architecture)
    layers = fields.integer("num_hidden_layers", maximum=MAX_LAYERS)
    window = fields.optional_integer("sliding_window", maximum=1 << 27)
    return read_decoder_config(fields, sliding_windows=(window,) * layers if window is not None else ())


class MistralForCausalLM(LlamaForCausalLM):
    """Mistral dense models (7B, NeMo, Small): GQA, optional sliding window, HF or native layout."""

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_mistral_config(hf_config)
