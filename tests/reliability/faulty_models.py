"""Model classes with a bug in one place, registered by the plugin-fault tests.

Each is the Llama model failing the way a buggy model plugin would: while
being built, or while its ``load_weights`` maps the checkpoint. The pipeline
must report the architecture and never hand out the model.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from loader_plugin_llama.model import LlamaForCausalLM


class FailsWhileBuilt(LlamaForCausalLM):
    """Raises a bug (not a LoadError) in ``__init__``."""

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        raise RuntimeError("layer 7 has no attribute 'mlp' (model plugin bug)")


class FailsInLoadWeights(LlamaForCausalLM):
    """Loads a few tensors, then raises a bug in ``load_weights``."""

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> set[str]:
        for index, _ in enumerate(weights):
            if index == 3:
                raise IndexError("list index out of range (model plugin bug)")
        return set()
