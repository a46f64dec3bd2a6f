"""Llama whose token embeddings are multiplied by ``embedding_multiplier`` before the first layer.

Everything else — layers, tensor parallelism, quantization, weight names — is
loader-plugin-llama's ``LlamaForCausalLM``: this subclass names its
architecture in config errors, reads one more field and scales in ``forward``.
(Granite models use the same field name, among other multipliers.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from loader.layers import KVCache
from loader.models import ModelContext
from loader_plugin_llama import ConfigFields, LlamaConfig, LlamaForCausalLM, parse_llama_config

__all__ = ["ScaledEmbeddingLlamaForCausalLM"]


class ScaledEmbeddingLlamaForCausalLM(LlamaForCausalLM):
    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        return parse_llama_config(hf_config, architecture=cls.__name__)

    def __init__(self, ctx: ModelContext) -> None:
        # Checked first, so a bad value fails before any layer is built; the message names the field.
        multiplier = ConfigFields(ctx.hf_config, type(self).__name__).number("embedding_multiplier")
        super().__init__(ctx)
        self.embedding_multiplier = multiplier

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        start = cache.seq_len if cache is not None else 0
        positions = torch.arange(start, start + input_ids.shape[-1], device=input_ids.device)
        hidden = self.model.embed_tokens(input_ids) * self.embedding_multiplier
        for layer in self.model.layers:
            hidden = layer(positions, hidden, cache)
        return self.lm_head(self.model.norm(hidden))  # type: ignore[no-any-return]
