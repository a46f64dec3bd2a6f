"""``LlamaForCausalLM``: the registered model class, and the base of the Mistral and Qwen models.

Subclasses change three things at most: :meth:`LlamaForCausalLM.parse_config`
(their own config fields), :attr:`LlamaForCausalLM.attention_class` (a
different attention block) and :meth:`LlamaForCausalLM.checkpoint_weights`
(renaming a non-Hugging Face layout before the stacked mapping).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from loader.errors import UnsupportedError
from loader.layers import KVCache, ParallelLMHead
from loader.models import SupportsQuantization, SupportsTensorParallel, current_session

from .config import LlamaConfig, parse_llama_config
from .decoder import LlamaAttention, LlamaModel
from .weight_loading import load_decoder_weights

if TYPE_CHECKING:
    from loader.models import ModelContext
    from loader.weights import CheckpointTensor

__all__ = ["LlamaForCausalLM", "check_tensor_parallel"]


def check_tensor_parallel(config: LlamaConfig, tp: int) -> None:
    """Fail early, naming the config field, when ``tp`` cannot split the model evenly."""
    if tp <= 1:
        return
    what = config.architecture
    if config.num_attention_heads % tp:
        raise UnsupportedError(
            f"{what}: num_attention_heads={config.num_attention_heads} is not divisible by "
            f"tensor parallel size {tp}"
        )
    kv = config.num_key_value_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise UnsupportedError(
            f"{what}: num_key_value_heads={kv} and tensor parallel size {tp} do not divide one another "
            "(key/value heads are split when tp divides them, replicated when they divide tp)"
        )
    has_dense_mlp = config.moe is None or bool(config.dense_layers)  # experts check their own split
    if has_dense_mlp and config.intermediate_size % tp:
        raise UnsupportedError(
            f"{what}: intermediate_size={config.intermediate_size} is not divisible by "
            f"tensor parallel size {tp}"
        )


class LlamaForCausalLM(nn.Module, SupportsTensorParallel, SupportsQuantization):
    """Llama 2/3/3.x: GQA, rotary scaling (llama3, linear, dynamic), optional biases, tied or untied head."""

    is_text_generation_model: ClassVar[bool] = True
    tied_embeddings_supported: ClassVar[bool] = True
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
    attention_class: ClassVar[type[LlamaAttention]] = LlamaAttention

    @classmethod
    def parse_config(cls, hf_config: Mapping[str, Any]) -> LlamaConfig:
        """This family's typed config; raises :class:`~loader.errors.ConfigError` naming a bad field."""
        return parse_llama_config(hf_config)

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__()
        self.config = self.parse_config(ctx.hf_config)
        check_tensor_parallel(self.config, current_session().tp_size)
        dtype = ctx.dtype
        self.model = LlamaModel(
            self.config, attention_class=self.attention_class, params_dtype=dtype,
            quant_config=ctx.quant_config, prefix="model",
        )
        tied = self.config.tie_word_embeddings
        self.lm_head = ParallelLMHead(  # a checkpoint may quantize an untied head (GPTQ's lm_head: true)
            self.config.vocab_size, self.config.hidden_size, params_dtype=dtype,
            quant_config=None if tied else ctx.quant_config, prefix="lm_head",
        )
        if tied:
            self.lm_head.tie_weights(self.model.embed_tokens)

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Float logits ``[batch, seq, vocab]``; with ``cache``, positions continue after what it holds."""
        start = cache.seq_len if cache is not None else 0
        positions = torch.arange(start, start + input_ids.shape[-1], device=input_ids.device)
        hidden = self.model(input_ids, positions, cache)
        return self.lm_head(hidden)  # type: ignore[no-any-return]

    def checkpoint_weights(
        self, weights: Iterable[tuple[str, CheckpointTensor]]
    ) -> Iterator[tuple[str, CheckpointTensor]]:
        """The checkpoint's tensors under Hugging Face names; Llama checkpoints already are."""
        yield from weights

    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> set[str]:
        """Route each tensor to its (fused) parameter; return the parameter names filled.

        With tied embeddings ``lm_head.weight`` is skipped if present (the head
        shares the embedding) and reported filled along with the embedding.
        """
        tied = self.config.tie_word_embeddings
        return load_decoder_weights(
            self,
            self.checkpoint_weights(weights),
            skip_names=frozenset({"lm_head.weight"}) if tied else frozenset(),
            aliases={"lm_head.weight": "model.embed_tokens.weight"} if tied else None,
        )
