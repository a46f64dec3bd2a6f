"""``TransformersForCausalLM``: any causal LM transformers knows, filled through loader's pipeline.

The pipeline builds this class on the ``meta`` device like any model; it
builds the transformers class from the checkpoint's config there (nothing is
allocated, nothing initialised), swaps linear layers for loader's when the
load is sharded or quantized (:mod:`.parallel`), and later fills every
parameter through loader's weight loaders (mapped CPU parameters, narrowed
reads). Buffers are computed by transformers itself once memory exists.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from loader.models import SupportsQuantization, SupportsTensorParallel, current_session

from .coverage import covered_architectures, hf_model_spec
from .expert_sharding import shard_experts
from .weight_loading import compute_buffers, load_hf_weights

if TYPE_CHECKING:
    from loader.layers import KVCache
    from loader.models import ModelContext
    from loader.weights import CheckpointTensor

    from .expert_sharding import ShardedExperts

__all__ = ["HF_MODEL", "TransformersForCausalLM"]

HF_MODEL = "hf_model"
"""The attribute holding the transformers model; its parameters are named under it."""


class TransformersForCausalLM(nn.Module, SupportsTensorParallel, SupportsQuantization):
    """The fallback: a transformers causal-LM class driven by loader (vLLM's ``TransformersForCausalLM``).

    Tensor parallelism needs the config's ``base_model_tp_plan``;
    quantization is bitsandbytes in flight only (both refused otherwise, naming
    the architecture).
    """

    is_text_generation_model: ClassVar[bool] = True
    tied_embeddings_supported: ClassVar[bool] = True
    fallback_architectures: ClassVar[tuple[str, ...]] = covered_architectures()

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__()
        spec = hf_model_spec(ctx.hf_config, trust_remote_code=ctx.trust_remote_code, source_dir=ctx.source_dir)
        self.architecture = spec.architecture
        self.label = f"transformers' {spec.architecture}"
        if ctx.quant_config is not None:
            from .quantization import check_quantization

            check_quantization(ctx.quant_config, spec.architecture)
        self.hf_config = spec.config
        build = spec.model_class._from_config  # type: ignore[attr-defined]
        self.hf_model: nn.Module = build(spec.config, dtype=ctx.dtype)
        self._gguf_architecture = spec.gguf_architecture
        self._gguf_names: dict[str, str] | None = None
        if spec.gguf_architecture is not None:  # a GGUF file: its tensors come under GGUF names
            from .gguf_names import gguf_to_hf_names

            layers = int(getattr(spec.config, "num_hidden_layers", 0) or 0)
            self._gguf_names = gguf_to_hf_names(self.hf_model, spec.gguf_architecture, layers)
        self._transposed: set[str] = set()
        self._sharded: dict[str, ShardedExperts] = {}
        if current_session().tp_size > 1 or ctx.quant_config is not None:  # a plain load keeps every module
            from .parallel import swap_linears

            plan = getattr(spec.config, "base_model_tp_plan", None)
            self._transposed = swap_linears(self.hf_model, architecture=spec.architecture, plan=plan,
                                            quant_config=ctx.quant_config, dtype=ctx.dtype)
            if plan and current_session().tp_size > 1:
                self._sharded = shard_experts(self.hf_model, plan, architecture=spec.architecture)
        self._caches: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def init_buffers(self, device: torch.device) -> None:
        """Called by the pipeline once memory exists: let transformers compute its buffers."""
        compute_buffers(self.hf_model)

    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> set[str]:
        """Fill every parameter by its transformers name; return the names (under ``hf_model.``) filled."""
        if self._gguf_names is not None and self._gguf_architecture is not None:  # a GGUF file: its names
            from .gguf_names import rename_gguf_weights

            weights = rename_gguf_weights(weights, self._gguf_names, arch=self._gguf_architecture, label=self.label)
        filled = load_hf_weights(self.hf_model, weights, transposed=self._transposed, label=self.label,
                                 sharded=self._sharded)
        return {f"{HF_MODEL}.{name}" for name in filled}

    def forward(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]``; with ``cache``, continue the sequence it has seen.

        transformers keeps its own key/value cache; it is kept beside loader's
        ``cache`` object (which only identifies the sequence) and dropped with it.
        """
        if cache is None:
            return self.hf_model(input_ids=input_ids, use_cache=False).logits  # type: ignore[no-any-return]
        hf_cache = self._caches.get(cache)
        if hf_cache is None:
            from transformers import DynamicCache

            hf_cache = self._caches[cache] = DynamicCache(config=self.hf_config)
        out = self.hf_model(input_ids=input_ids, past_key_values=hf_cache, use_cache=True)
        return out.logits  # type: ignore[no-any-return]
