"""From checkpoint names to a transformers model's parameters, through loader's weight loaders.

Names are the model's own ``state_dict`` names. As ``from_pretrained`` does,
a checkpoint written from the base model alone (GPT-2's original files have
no ``transformer.`` prefix) gets the base-model prefix added, tensors the
model class says to ignore (``_keys_to_ignore_on_load_unexpected``, computed
rotary tables, ``position_ids``) are skipped, and a tied parameter is loaded
once, under whichever of its names the checkpoint holds (``lm_head.weight``
or the embedding's).
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

from .conversions import CheckpointConversions, FusedGroup, Route
from .fused_writes import write_group
from .transposed import TransposedTensor

if TYPE_CHECKING:
    from collections.abc import Mapping

    from loader.weights import CheckpointTensor

    from .expert_sharding import ShardedExperts

__all__ = ["compute_buffers", "load_hf_weights"]

_SHOWN = 20
_ALWAYS_IGNORED = (r"rotary_emb\.inv_freq", r"(^|\.)position_ids$", r"rotary_emb\.(cos|sin)_cached")


def _ignore_pattern(hf_model: nn.Module) -> re.Pattern[str]:
    patterns = set(getattr(hf_model, "_keys_to_ignore_on_load_unexpected", None) or ()) | set(_ALWAYS_IGNORED)
    return re.compile("|".join(f"({p})" for p in sorted(patterns)))


def _take_fused(groups: dict[str, FusedGroup], route: Route, tensor: CheckpointTensor, *, label: str,
                params: Mapping[str, torch.Tensor], shapes: Mapping[str, tuple[int, ...]],
                sharded: Mapping[str, ShardedExperts]) -> set[str]:
    """Hold a converter's input in its group; write the group once complete (return what it filled)."""
    target = route.target
    group = groups.get(target)
    if group is None:
        group = groups[target] = FusedGroup(target, route.converter, label)  # type: ignore[arg-type]
    elif group.written:
        count = group.count or 0
        if route.item is not None and route.item >= count:
            raise UnexpectedWeightError(f"{tensor.describe()}: expert {route.item} is out of range for {target}, "
                                        f"which holds {count} experts")
        raise UnexpectedWeightError(f"{tensor.describe()}: {target} was already filled from the checkpoint")
    group.add(route, tensor)
    if not group.is_complete(shapes):
        return set()
    filled = write_group(group, params, shapes, sharded)
    group.written = True
    group.sources.clear()  # the tensors are read: keep no handles
    return filled


def load_hf_weights(hf_model: nn.Module, weights: Iterable[tuple[str, CheckpointTensor]], *,
                    transposed: set[str], label: str, sharded: Mapping[str, ShardedExperts] | None = None
                    ) -> set[str]:
    """Fill every parameter of ``hf_model`` from ``weights``; return the names filled (``named_parameters``).

    Names go through transformers' conversions (:mod:`.conversions`): renamed
    tensors straight to their parameter, fused ones (experts) held unread until
    their parameter's inputs are all there, then each read once into its place.

    :param transposed: modules whose checkpoint weight is ``(in, out)`` but are now loader layers
        (swapped ``Conv1D``): their ``.weight`` is read transposed.
    :param label: how errors name the model (``transformers' GPT2LMHeadModel``).
    :param sharded: fused expert parameters of which this rank holds a share (:mod:`.expert_sharding`).
    """
    sharded = sharded or {}
    params = dict(hf_model.named_parameters())
    every = dict(hf_model.named_parameters(remove_duplicate=False))
    buffers = dict(hf_model.named_buffers())
    names: dict[str, torch.Tensor] = {**buffers, **every}
    shapes = {name: tuple(tensor.shape) for name, tensor in names.items()}
    primary = {id(param): name for name, param in params.items()}
    tied = {name: primary[id(param)] for name, param in every.items() if primary[id(param)] != name}
    shared = set(tied.values())
    shapes.update({name: share.whole_shape for name, share in sharded.items()})
    conversions = CheckpointConversions(hf_model, names)
    ignored = _ignore_pattern(hf_model)
    groups: dict[str, FusedGroup] = {}
    filled: set[str] = set()
    for name, tensor in weights:
        route = conversions.route(name)
        target = tied.get(route.target, route.target)
        if target in filled and target in shared:
            continue  # a tied parameter's second name: the first one is loaded
        if route.converter is not None and target in names:
            filled |= _take_fused(groups, route, tensor, label=label, params=params, shapes=shapes, sharded=sharded)
        elif target in params:
            param = params[target]
            module, _, leaf = target.rpartition(".")
            loaded = TransposedTensor(tensor) if leaf == "weight" and module in transposed else tensor
            weight_loader_of(param)(param, loaded)
            filled.add(target)
        elif target in buffers:  # a persistent buffer the checkpoint holds wins over the computed one
            tensor.read_into(buffers[target])
        elif not ignored.search(name):
            renamed = f" (transformers converts it to {target!r})" if target != name else ""
            raise UnexpectedWeightError(f"{tensor.describe()}: {label} has no parameter or buffer {name!r}{renamed}")
    for group in groups.values():
        if group.written:
            continue
        raise MissingWeightsError(f"the checkpoint has no tensor for {', '.join(group.missing(shapes)[:_SHOWN])}, "
                                  f"which {label} fuses into {group.target}")
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
