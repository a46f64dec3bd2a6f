"""From checkpoint names to a transformers model's parameters, through loader's weight loaders.

Names are the model's own ``state_dict`` names. As ``from_pretrained`` does,
a checkpoint written from the base model alone (GPT-2's original files have
no ``transformer.`` prefix) gets the base-model prefix added, tensors the
model class says to ignore (``_keys_to_ignore_on_load_unexpected``, computed
rotary tables, ``position_ids``) are skipped, and an alias of a tied
parameter (``lm_head.weight`` with tied embeddings) is not loaded twice.
Anything else without a place is an :class:`~loader.errors.UnexpectedWeightError`,
and every parameter left without a tensor is a
:class:`~loader.errors.MissingWeightsError` naming it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from loader.errors import MissingWeightsError, UnexpectedWeightError
from loader.layers import weight_loader_of

from .transposed import TransposedTensor

if TYPE_CHECKING:
    from loader.weights import CheckpointTensor

__all__ = ["compute_buffers", "load_hf_weights"]

_SHOWN = 20
_ALWAYS_IGNORED = (r"rotary_emb\.inv_freq", r"(^|\.)position_ids$", r"rotary_emb\.(cos|sin)_cached")


def _ignore_pattern(hf_model: nn.Module) -> re.Pattern[str]:
    patterns = set(getattr(hf_model, "_keys_to_ignore_on_load_unexpected", None) or ()) | set(_ALWAYS_IGNORED)
    return re.compile("|".join(f"({p})" for p in sorted(patterns)))


def _target(name: str, names: Iterable[str] | set[str], base_prefix: str) -> str:
    """``name``, or ``name`` under the base-model prefix when only that is a tensor of the model."""
    if name in names or not base_prefix:
        return name
    prefixed = f"{base_prefix}.{name}"
    return prefixed if prefixed in names else name


def load_hf_weights(hf_model: nn.Module, weights: Iterable[tuple[str, CheckpointTensor]], *,
                    transposed: set[str], label: str) -> set[str]:
    """Fill every parameter of ``hf_model`` from ``weights``; return the names filled (``named_parameters``).

    :param transposed: modules whose checkpoint weight is ``(in, out)`` but are now loader layers
        (swapped ``Conv1D``): their ``.weight`` is read transposed.
    :param label: how errors name the model (``transformers' GPT2LMHeadModel``).
    """
    params = dict(hf_model.named_parameters())
    every = dict(hf_model.named_parameters(remove_duplicate=False))
    aliases = set(every) - set(params)
    buffers = dict(hf_model.named_buffers())
    known = set(every) | set(buffers)
    base_prefix = str(getattr(hf_model, "base_model_prefix", "") or "")
    ignored = _ignore_pattern(hf_model)
    filled: set[str] = set()
    for name, tensor in weights:
        target = _target(name, known, base_prefix)
        if target in aliases:
            continue  # a tied parameter's second name: the first one is loaded
        if target in params:
            param = params[target]
            module, _, leaf = target.rpartition(".")
            loaded = TransposedTensor(tensor) if leaf == "weight" and module in transposed else tensor
            weight_loader_of(param)(param, loaded)
            filled.add(target)
        elif target in buffers:  # a persistent buffer the checkpoint holds wins over the computed one
            tensor.read_into(buffers[target])
        elif ignored.search(name):
            continue
        else:
            raise UnexpectedWeightError(f"{tensor.describe()}: {label} has no parameter or buffer {name!r}")
    missing = [name for name in params if name not in filled]
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (f", ... ({len(missing)} in all)" if len(missing) > _SHOWN else "")
        raise MissingWeightsError(f"the checkpoint has no tensor for {shown}, which {label} needs")
    return filled


def compute_buffers(hf_model: nn.Module) -> None:
    """Compute the buffers (rotary tables, embedding scales) of a materialized model, as ``from_pretrained`` does.

    Every parameter is flagged as set first (the checkpoint fills them), so
    transformers' ``initialize_weights`` writes only the buffers and never
    touches (or pages in) parameter memory.
    """
    for param in hf_model.parameters():
        param._is_hf_initialized = True  # type: ignore[attr-defined]
    with torch.no_grad():
        hf_model.initialize_weights()  # type: ignore[operator]
