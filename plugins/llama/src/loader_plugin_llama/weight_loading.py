"""From checkpoint names to the decoder's fused parameters: the stacked mapping.

Checkpoints store ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj``
separately; the model holds them fused (``qkv_proj``, ``gate_up_proj``) so one
matmul serves all parts. :func:`load_decoder_weights` renames each tensor,
hands it to the parameter's ``weight_loader`` with the part's shard id (the
layer narrows it to this rank's rows before anything is read) and returns the
parameter names it filled — a fused parameter only once *every* part arrived,
so a checkpoint missing ``k_proj`` is reported rather than loaded with
garbage rows. Expert tensors of a mixture-of-experts model
(``mlp.experts.7.gate_proj.weight``, or one 3-D tensor of every expert) go to
their ``FusedMoE`` layer's expert-aware loader first; a layer reports its
parameters filled only once every local expert's every part arrived.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import attrs

from loader.errors import MissingWeightsError, UnexpectedWeightError
from loader.layers import ExpertNames, FusedMoE, LinearBase, weight_loader_of

if TYPE_CHECKING:
    from torch import nn

    from loader.weights import CheckpointTensor

__all__ = [
    "NON_PARAMETER_SUFFIXES",
    "StackedParam",
    "load_decoder_weights",
    "stacked_params",
]

ShardId = int | str


@attrs.frozen
class StackedParam:
    """Checkpoint module ``part`` lands in fused module ``fused`` as shard ``shard_id``."""

    fused: str
    part: str
    shard_id: ShardId


def stacked_params(model: nn.Module) -> tuple[StackedParam, ...]:
    """The model's stacked mapping, from the one table it declares.

    The fused modules and their checkpoint parts come from the class's
    ``packed_modules_mapping`` (what quantization configs also see); each
    part's shard id is the fused layer's own (``QKVParallelLinear.shard_ids()``
    is ``["q", "k", "v"]``), so neither is written down twice.
    """
    table: Mapping[str, list[str]] = getattr(type(model), "packed_modules_mapping", {})
    shard_ids: dict[str, list[ShardId | None]] = {}
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if leaf in table and leaf not in shard_ids and isinstance(module, LinearBase):
            shard_ids[leaf] = module.shard_ids()
    stacked = []
    for fused, parts in table.items():
        ids = shard_ids.get(fused)
        if ids is None:
            continue
        if len(ids) != len(parts) or None in ids:
            raise ValueError(
                f"{type(model).__name__}.packed_modules_mapping[{fused!r}] lists {len(parts)} parts, but the "
                f"layer {fused!r} has shards {ids}"
            )
        stacked += [StackedParam(fused, part, sid) for part, sid in zip(parts, ids, strict=True)
                    if sid is not None]
    return tuple(stacked)


#: tensors some checkpoints carry that are computed, not learned (rotary tables).
NON_PARAMETER_SUFFIXES: tuple[str, ...] = (
    "rotary_emb.inv_freq",
    "rotary_emb.cos_cached",
    "rotary_emb.sin_cached",
)


def _stacked_target(name: str, stacked: Iterable[StackedParam]) -> tuple[str, ShardId] | None:
    """``model.layers.0.self_attn.k_proj.weight`` -> (``...qkv_proj.weight``, ``"k"``)."""
    for entry in stacked:
        marker = f".{entry.part}."
        if marker in name:
            return name.replace(marker, f".{entry.fused}.", 1), entry.shard_id
    return None


def _describe(name: str, tensor: CheckpointTensor) -> str:
    described = tensor.describe()
    return described if name in described else f"{described} (as {name!r})"


def load_decoder_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, CheckpointTensor]],
    *,
    stacked: Iterable[StackedParam] | None = None,
    skip_names: frozenset[str] = frozenset(),
    aliases: Mapping[str, str] | None = None,
) -> set[str]:
    """Load ``weights`` into ``model`` by name; return the parameter names filled.

    :param stacked: how checkpoint parts land in fused parameters
        (default: :func:`stacked_params` of ``model``).
    :param skip_names: checkpoint names to ignore (``lm_head.weight`` with tied embeddings).
    :param aliases: names (as in ``named_parameters(remove_duplicate=False)``)
        that are the same parameter as another; when the target is filled the
        alias is reported filled too.
    :raises UnexpectedWeightError: a tensor the model has no parameter for.
    :raises MissingWeightsError: a fused parameter got some of its parts but not all.
    """
    stacked = stacked_params(model) if stacked is None else tuple(stacked)
    params = dict(model.named_parameters(remove_duplicate=False))
    parts_seen: dict[str, dict[ShardId, str]] = {}
    filled: set[str] = set()
    experts = {path: module for path, module in model.named_modules() if isinstance(module, FusedMoE)}
    expert_names = next(iter(experts.values())).names if experts else None

    for name, tensor in weights:
        if name in skip_names or name.endswith(NON_PARAMETER_SUFFIXES):
            continue
        if expert_names is not None and _load_expert(params, expert_names, name, tensor):
            continue
        target = _stacked_target(name, stacked)
        if target is not None and target[0] in params:
            param_name, shard_id = target
            fused_param = params[param_name]
            weight_loader_of(fused_param)(fused_param, tensor, shard_id)
            parts_seen.setdefault(param_name, {})[shard_id] = name
            continue
        param = params.get(name)
        if param is None:
            raise UnexpectedWeightError(
                f"{_describe(name, tensor)}: the {type(model).__name__} model has no parameter for it"
            )
        weight_loader_of(param)(param, tensor)
        filled.add(name)

    filled |= _fused_params_complete(parts_seen, stacked)
    for path, layer in experts.items():
        filled |= {f"{path}.{param}" for param in layer.loaded_parameters()}
    for alias, target_name in (aliases or {}).items():
        if target_name in filled:
            filled.add(alias)
    return filled


def _load_expert(params: Mapping[str, nn.Parameter], names: ExpertNames, name: str,
                 tensor: CheckpointTensor) -> bool:
    """Hand an expert's tensor to its ``FusedMoE`` loader; ``False`` when ``name`` is no expert's (or the model
    has no such layer there: a dense layer of a MoE model, reported as unexpected by the caller)."""
    target = names.target(name)
    if target is None or target.param_name not in params:
        return False
    param = params[target.param_name]
    weight_loader_of(param)(param, tensor, name, target.shard_id, target.expert_id)
    return True


def _fused_params_complete(parts_seen: Mapping[str, Mapping[ShardId, str]],
                           stacked: tuple[StackedParam, ...]) -> set[str]:
    """The fused parameters that got every part (their names); one that got some but not all is an error.

    :raises MissingWeightsError: naming the checkpoint tensors a fused parameter still lacks.
    """
    parts_expected: dict[str, set[ShardId]] = {}
    for entry in stacked:
        parts_expected.setdefault(entry.fused, set()).add(entry.shard_id)
    for param_name, seen in parts_seen.items():
        fused = next(e.fused for e in stacked if f".{e.fused}." in param_name)
        missing = parts_expected[fused] - set(seen)
        if missing:
            example = next(iter(seen.values()))
            names = sorted(_part_name(example, stacked, sid) for sid in missing)
            raise MissingWeightsError(
                f"parameter {param_name!r} is fused from several checkpoint tensors, but "
                f"{', '.join(repr(n) for n in names)} {'is' if len(names) == 1 else 'are'} missing"
            )
    return set(parts_seen)


def _part_name(example: str, stacked: Iterable[StackedParam], shard_id: ShardId) -> str:
    """The checkpoint name of part ``shard_id``, built from the name of a sibling part."""
    stacked = tuple(stacked)
    sibling = next(e for e in stacked if f".{e.part}." in example)
    wanted = next(e for e in stacked if e.fused == sibling.fused and e.shard_id == shard_id)
    return example.replace(f".{sibling.part}.", f".{wanted.part}.", 1)
