"""Token embedding and LM head split by vocabulary rows over tensor-parallel ranks.

The vocabulary is padded to a multiple of ``padding_size * tp`` so every rank
holds the same number of rows; rows past the real vocabulary are zero. A rank
looks up only the ids in its range (others give zero) and an all-reduce sums
the ranks' answers; the head computes its logits slice and all-gathers them,
then trims the padding so every rank sees the full, real vocabulary.

A checkpoint may quantize the head like a linear layer (GPTQ's ``lm_head:
true``): given a ``quant_config`` whose ``get_quant_method`` answers for the
head, :class:`ParallelLMHead` lets that method create its parameters (named as
in the checkpoint, e.g. ``lm_head.qweight``) and multiply, as vLLM's head does.
The rows are still split by vocabulary, so a tensor packed along the output dim
is narrowed in whole packed elements.

The embedding asks the same way (``VocabParallelEmbedding(quant_config=...)``)
for an :class:`~loader.layers.quantization.EmbeddingMethodBase`, which keeps
the table as the checkpoint stores it (GGUF blocks) and turns only the
looked-up rows into floats; a head tied to such an embedding multiplies through
the embedding's method, so the table is held once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .. import _distributed
from .._mapped_parameters import fill_parameter
from .._session import current_session
from ..errors import UnsupportedError
from .default_loader import check_shape
from .param_layout import ParamLayout, layout_of, param_shape, set_param_layout
from .quantization import (
    EmbeddingMethodBase,
    EmbeddingShape,
    LinearMethodBase,
    LinearShape,
    QuantizeMethodBase,
    UnquantizedLinearMethod,
    embedding_method_for,
    linear_method_for,
)
from .shard_loading import NarrowedPart

if TYPE_CHECKING:
    from ..weights import CheckpointTensor
    from .quantization import QuantizationConfig

__all__ = ["ParallelLMHead", "VocabParallelEmbedding", "pad_vocab_size"]


def pad_vocab_size(vocab_size: int, multiple: int) -> int:
    """``vocab_size`` rounded up to a multiple of ``multiple``."""
    return -(-vocab_size // multiple) * multiple


class VocabParallelEmbedding(nn.Module):
    """Embedding table with its (padded) vocabulary rows split evenly over ranks.

    ``vocab_start``/``vocab_end`` are this rank's rows of the padded table;
    ids outside them look up zeros here and are filled in by their owner's
    rank through the all-reduce. With a ``quant_config`` whose method answers
    for this embedding, the method creates the parameters and does the lookup.
    """

    quant_method: QuantizeMethodBase | None

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        params_dtype: torch.dtype | None = None,
        padding_size: int = 64,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        session = current_session()
        self.params_dtype = params_dtype if params_dtype is not None else session.dtype
        self.prefix = prefix
        self.tp_rank = session.tp_rank
        self.tp_size = session.tp_size
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, padding_size * self.tp_size)
        self.num_embeddings_per_partition = self.num_embeddings_padded // self.tp_size
        self.vocab_start = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end = self.vocab_start + self.num_embeddings_per_partition
        weight = nn.Parameter(
            torch.empty(self.num_embeddings_per_partition, embedding_dim, dtype=self.params_dtype),
            requires_grad=False,
        )
        set_param_layout(weight, ParamLayout(weight_loader=self.weight_loader, output_dim=0))
        self.weight = weight
        method = embedding_method_for(quant_config, self, prefix) if quant_config is not None else None
        self.quant_method = method
        if method is not None:
            del self.weight  # the method's parameters replace the dense table (built on meta: nothing allocated)
            method.create_weights(self, EmbeddingShape(
                rows_per_partition=self.num_embeddings_per_partition, embedding_dim=embedding_dim,
                params_dtype=self.params_dtype, weight_loader=self.weight_loader,
            ))

    @property
    def display_name(self) -> str:
        """How messages name this layer: its prefix, or its class for a layer built without one."""
        return self.prefix or type(self).__name__

    @property
    def real_rows(self) -> int:
        """Rows of this rank's shard that hold real vocabulary (the rest are padding)."""
        return max(0, min(self.vocab_end, self.num_embeddings) - self.vocab_start)

    def weight_loader(self, param: torch.Tensor, loaded: CheckpointTensor, shard_id: object = None) -> None:
        """Read this rank's vocabulary rows of ``loaded`` and zero the padding rows."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} {self.prefix!r} has no shard {shard_id!r}")
        layout = layout_of(param)
        output_dim = layout.output_dim
        if output_dim is None:  # a per-tensor value some plugin attached
            check_shape(loaded, param.shape, self.display_name)
            fill_parameter(param, loaded)
            return
        pack = layout.pack_along(output_dim)  # a quantized head's tensor packed along the vocabulary
        expected = list(param_shape(param, layout))
        expected[output_dim] = self._stored(self.num_embeddings, pack, "vocabulary size")
        check_shape(loaded, expected, self.display_name)
        rows = self._stored(self.real_rows, pack, "rows of this rank")
        if layout.load_part is not None:  # a method that keeps the rows its own way (GGUF blocks)
            start = self._stored(self.vocab_start, pack, "first row of this rank")
            layout.load_part(param, NarrowedPart(None, loaded.narrow(output_dim, start, rows), loaded, 0, rows,
                                                 (start, rows), None))
            return
        if rows:
            mine = loaded.narrow(output_dim, self._stored(self.vocab_start, pack, "first row of this rank"), rows)
            fill_parameter(param, mine, output_dim, 0)
        padding = param.shape[output_dim] - rows
        if padding:
            param.data.narrow(output_dim, rows, padding).zero_()

    def _stored(self, rows: int, pack: int, what: str) -> int:
        """``rows`` vocabulary rows in stored elements of ``pack`` rows; a split inside one is refused."""
        if rows % pack:
            raise UnsupportedError(f"{self.display_name}: the {what} ({rows}) is not a whole number of packed elements "
                             f"of {pack} rows")
        return rows // pack

    def _lookup(self, ids: torch.Tensor) -> torch.Tensor:
        if isinstance(self.quant_method, EmbeddingMethodBase):
            return self.quant_method.embedding(self, ids)
        return F.embedding(ids, self.weight)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return self._lookup(input_ids)
        outside = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local = (input_ids - self.vocab_start).masked_fill(outside, 0)
        out = self._lookup(local).masked_fill(outside.unsqueeze(-1), 0)
        return _distributed.all_reduce(out)

    def extra_repr(self) -> str:
        return (
            f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
            f"padded={self.num_embeddings_padded}, rows=[{self.vocab_start}, {self.vocab_end})"
        )


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection to vocabulary logits, split like the embedding.

    ``forward(hidden)`` returns float logits over the real vocabulary on every
    rank. ``tie_weights(embedding)`` shares the embedding's parameter (models
    with tied embeddings have no ``lm_head.weight`` in the checkpoint).
    """

    bias: nn.Parameter | None
    quant_method: LinearMethodBase | None

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        bias: bool = False,
        params_dtype: torch.dtype | None = None,
        padding_size: int = 64,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        """``quant_config``: the checkpoint's quantization, asked for this head's method like a linear layer's
        (configs that answer only for linear layers leave the head dense)."""
        super().__init__(
            num_embeddings, embedding_dim, params_dtype=params_dtype, padding_size=padding_size, prefix=prefix
        )
        method = linear_method_for(quant_config, self, prefix) if quant_config is not None else None
        self.quant_method = None if method is None or isinstance(method, UnquantizedLinearMethod) else method
        if self.quant_method is not None:
            del self.weight  # the method's parameters replace the dense weight (built on meta: nothing allocated)
            self.quant_method.create_weights(self, LinearShape(
                input_size_per_partition=embedding_dim, output_partition_sizes=(self.num_embeddings_per_partition,),
                input_size=embedding_dim, output_size=self.num_embeddings_padded,
                params_dtype=self.params_dtype, weight_loader=self.weight_loader,
            ))
        if bias:
            b = nn.Parameter(torch.empty(self.num_embeddings_per_partition, dtype=self.params_dtype),
                             requires_grad=False)
            set_param_layout(b, ParamLayout(weight_loader=self.weight_loader, output_dim=0))
            self.bias = b
        else:
            self.register_parameter("bias", None)

    def tie_weights(self, embedding: VocabParallelEmbedding) -> ParallelLMHead:
        """Use ``embedding``'s weight as this head's weight (same parameter object).

        An embedding with a quantize method keeps its table its own way: the
        head then has no weight and multiplies through that method
        (``EmbeddingMethodBase.apply``) on the embedding's storage.
        """
        if self.quant_method is not None:
            raise ValueError(f"cannot tie the quantized {self.display_name!r} to {embedding.prefix!r}")
        if (embedding.num_embeddings_padded, embedding.embedding_dim, embedding.tp_rank) != (
            self.num_embeddings_padded, self.embedding_dim, self.tp_rank
        ):
            raise ValueError(
                f"cannot tie {self.prefix!r} to {embedding.prefix!r}: shards differ "
                f"({embedding.extra_repr()} vs {self.extra_repr()})"
            )
        if isinstance(embedding.quant_method, EmbeddingMethodBase):
            del self.weight
            # a plain attribute, not a submodule: the embedding stays registered once, under the model
            self.__dict__["tied_embedding"] = embedding
            embedding.quant_method.tie_head(embedding)
            return self
        self.weight = embedding.weight
        return self

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        tied = self.__dict__.get("tied_embedding")
        if tied is not None:
            logits = tied.quant_method.apply(tied, hidden, self.bias)
        elif self.quant_method is not None:
            logits = self.quant_method.apply(self, hidden, self.bias)
        else:
            logits = F.linear(hidden, self.weight, self.bias)
        logits = _distributed.all_gather(logits, dim=-1)
        return logits[..., : self.num_embeddings].float()
