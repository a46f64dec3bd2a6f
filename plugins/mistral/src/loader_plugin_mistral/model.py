"""``MistralForCausalLM``: the Llama implementation with a sliding window, from either layout.

A checkpoint in Hugging Face's layout loads exactly as Llama does; one in
Mistral's native layout (config translated from ``params.json``) arrives
already renamed and un-interleaved by its format's renaming step
(:mod:`loader_plugin_mistral.native_layout`), so the model sees one layout.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from loader.layers import MoESettings
from loader_plugin_llama import MAX_LAYERS, ConfigFields, LlamaConfig, LlamaForCausalLM, read_decoder_config

if TYPE_CHECKING:
    from loader.weights import CheckpointTensor

__all__ = ["MistralForCausalLM", "MixtralForCausalLM", "parse_mistral_config", "parse_mixtral_config"]

MAX_EXPERTS = 1 << 16


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


def parse_mixtral_config(hf_config: Mapping[str, Any], architecture: str = "MixtralForCausalLM") -> LlamaConfig:
    """Mixtral: Mistral's decoder with every MLP a sparse MoE block (``num_local_experts`` experts of
    ``intermediate_size``, ``num_experts_per_tok`` chosen, weights always renormalised)."""
    config = parse_mistral_config(hf_config, architecture)
    fields = ConfigFields(hf_config, architecture)
    experts = fields.integer("num_local_experts", 8, maximum=MAX_EXPERTS)
    settings = MoESettings(
        num_experts=experts,
        top_k=fields.integer("num_experts_per_tok", 2, maximum=experts),
        intermediate_size=config.intermediate_size,
        renormalize=True,
        expert_names=("w1", "w2", "w3"),
    )
    return attrs.evolve(config, moe=settings)


class MixtralForCausalLM(MistralForCausalLM):
    """Mixtral 8x7B / 8x22B: each MLP is ``block_sparse_moe`` (router ``gate``, experts ``w1``/``w2``/``w3``)."""

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_mixtral_config(hf_config)

    def checkpoint_weights(
        self, weights: Iterable[tuple[str, CheckpointTensor]]
    ) -> Iterator[tuple[str, CheckpointTensor]]:
        """``block_sparse_moe`` is the decoder's ``mlp`` (one decoder for dense and sparse families)."""
        for name, tensor in weights:
            yield name.replace(".block_sparse_moe.", ".mlp.", 1), tensor
