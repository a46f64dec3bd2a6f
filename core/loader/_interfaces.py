"""What a model class declares about itself, read by the registry's probe.

Model plugins mix these into their classes (or set the class attributes
directly). The registry computes :class:`~loader._registry.ModelInfo` from them
without instantiating anything, in a child process for lazily registered
classes.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

    from ._context import ModelContext
    from .weights import CheckpointTensor

__all__ = [
    "CausalLM",
    "SupportsPipelineParallel",
    "SupportsQuantization",
    "SupportsTensorParallel",
]


class SupportsTensorParallel:
    """The model shards its layers over ``torch.distributed`` ranks."""

    supports_tensor_parallel: ClassVar[bool] = True


class SupportsPipelineParallel:
    """The model can be cut into stages (none of ours yet; declared for plugins that can)."""

    supports_pipeline_parallel: ClassVar[bool] = True


class SupportsQuantization:
    """The model's linear layers route through quantize methods.

    ``packed_modules_mapping`` says which checkpoint modules each fused layer
    holds (``{"qkv_proj": ["q_proj", "k_proj", "v_proj"]}``). Declare it once:
    the pipeline hands it to the quantization config before building the model
    (``QuantizationConfig.set_packed_modules``), so skip lists and per-module
    configs written against the checkpoint's names reach the fused layers.
    """

    supports_quantization: ClassVar[bool] = True
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {}


@runtime_checkable
class CausalLM(Protocol):
    """The shape every text-generation model class has.

    ``__init__(ctx)`` builds this rank's layers (the pipeline calls it on the
    ``meta`` device); ``load_weights`` maps checkpoint names to parameters and
    returns the names it filled; ``forward`` returns logits ``[batch, seq, vocab]``.
    """

    is_text_generation_model: ClassVar[bool]

    def __init__(self, ctx: ModelContext) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> set[str]: ...

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor: ...
