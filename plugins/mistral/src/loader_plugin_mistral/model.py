"""``MistralForCausalLM``: the Llama implementation with a sliding window, from either layout.

A checkpoint in Hugging Face's layout loads exactly as Llama does; one in
Mistral's native layout (config translated from ``params.json``, marked with
:data:`~loader_plugin_mistral.native_config.NATIVE_LAYOUT_KEY`) is renamed and
un-interleaved by :mod:`loader_plugin_mistral.native_layout` on the way in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from loader_plugin_llama.config import MAX_LAYERS, LlamaConfig, read_decoder_config
from loader_plugin_llama.config_fields import ConfigFields
from loader_plugin_llama.model import LlamaForCausalLM

from .native_config import NATIVE_LAYOUT_KEY, NATIVE_LAYOUT_VALUE
from .native_layout import native_to_hf_weights

if TYPE_CHECKING:
    from loader.context import ModelContext
    from loader.weights import CheckpointTensor

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

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__(ctx)
        self.native_layout = ctx.hf_config.get(NATIVE_LAYOUT_KEY) == NATIVE_LAYOUT_VALUE

    def checkpoint_weights(
        self, weights: Iterable[tuple[str, CheckpointTensor]]
    ) -> Iterator[tuple[str, CheckpointTensor]]:
        if not self.native_layout:
            yield from weights
            return
        yield from native_to_hf_weights(
            weights, self.config.num_attention_heads, self.config.num_key_value_heads
        )
