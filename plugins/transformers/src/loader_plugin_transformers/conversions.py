"""The checkpoint conversions ``from_pretrained`` applies, driven from transformers' own conversion objects.

transformers 5 renames checkpoint keys and fuses tensors while loading
(``WeightRenaming`` / ``WeightConverter`` objects from
``transformers.conversion_mapping.get_model_conversion_mapping``: the legacy
``gamma``/``beta`` renames, GPT-NeoX's ``embed_out`` -> ``lm_head``, each
MoE architecture's expert stacking). The fallback asks transformers for that
list for the built model, so it follows the installed version, and names each
checkpoint tensor's destination with transformers' own ``rename_source_key``.
A plain rename goes straight to its parameter; a tensor a converter takes
joins a :class:`FusedGroup` (one per fused parameter, as transformers keys
them), which is placed once all its inputs have arrived
(:mod:`.conversion_ops` follows the operations on shapes; nothing is read
until the placement is known, and each input is read once, into place).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
from transformers.conversion_mapping import get_model_conversion_mapping
from transformers.core_model_loading import WeightConverter, WeightRenaming, apply_renamings, rename_source_key

from loader.errors import ShapeMismatchError, UnsupportedError

from .conversion_ops import Layout, UnfollowedOperation, follow_operations, unknown_count_dim

if TYPE_CHECKING:
    from torch import nn

    from loader.weights import CheckpointTensor

__all__ = ["CheckpointConversions", "FusedGroup", "Route"]


@attrs.frozen
class Route:
    """Where one checkpoint tensor goes: a parameter or buffer name, or a converter's input."""

    target: str
    """The model name (for a converter: its first target, transformers' key for the fused group)."""
    converter: WeightConverter | None = None
    source: int = 0
    """Index of the converter's source pattern the name matched."""
    item: int | None = None
    """The expert index in the name, for a source pattern with ``*``."""


def _index_pattern(source_pattern: str) -> re.Pattern[str] | None:
    """A regex that finds the ``*`` index of ``source_pattern`` in a key (``None``: the pattern has no ``*``)."""
    if "*" not in source_pattern:
        return None
    left, _, right = source_pattern.partition("*")
    literal = [re.escape(part.replace("\\", "").lstrip("^")) for part in (left, right)]
    return re.compile(literal[0] + r"(\d+)" + literal[1])


def _name_of_item(held: _Source, pattern: str, item: int) -> str:
    """The checkpoint name expert ``item`` would have, from a name its source holds (else from the pattern)."""
    index = _index_pattern(pattern)
    for tensor in held.tensors.values():
        found = index.search(tensor.name) if index is not None else None
        if found is not None:
            return f"{tensor.name[:found.start(1)]}{item}{tensor.name[found.end(1):]}"
    return pattern.replace("*", str(item))


class CheckpointConversions:
    """transformers' renames and converters for one built model, applied to checkpoint names.

    :param names: every parameter and buffer name of the model (tied aliases included).
    """

    def __init__(self, hf_model: nn.Module, names: Mapping[str, Any]) -> None:
        transforms = get_model_conversion_mapping(hf_model, None, None)  # type: ignore[arg-type]
        self.renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        self.converters = [t for t in transforms if isinstance(t, WeightConverter)]
        self._by_pattern = {p: c for c in self.converters for p in c.source_patterns}
        self._index = {p: _index_pattern(p) for p in self._by_pattern}
        self.base_prefix = str(getattr(hf_model, "base_model_prefix", "") or "")
        self._names = dict(names)

    def route(self, name: str) -> Route:
        """The destination of checkpoint tensor ``name`` (its target may still be unknown to the model)."""
        renamed, pattern = rename_source_key(name, self.renamings, self.converters, self.base_prefix, self._names)
        if renamed not in self._names and name in self._names:  # transformers keeps a name the model has
            return Route(name)
        if pattern is None:
            return Route(renamed)
        converter = self._by_pattern[pattern]
        index = self._index[pattern]
        item = None
        if index is not None:
            found = index.search(apply_renamings(name, self.renamings))
            item = int(found.group(1)) if found else None
        return Route(renamed, converter, converter.source_patterns.index(pattern), item)


@attrs.define
class _Source:
    shape: tuple[int, ...]
    tensors: dict[int, CheckpointTensor]


@attrs.define
class FusedGroup:
    """The inputs of one converter for one fused parameter, held unread until every one has arrived."""

    target: str
    converter: WeightConverter
    label: str
    sources: dict[int, _Source] = attrs.field(factory=dict)
    count: int | None = None
    written: bool = False
    """Every input arrived and was read into place."""

    def add(self, route: Route, tensor: CheckpointTensor) -> None:
        """Hold ``tensor``; a second input of one source must have the first one's shape."""
        item = route.item if route.item is not None else 0
        held = self.sources.get(route.source)
        if held is None:
            self.sources[route.source] = _Source(tuple(tensor.shape), {item: tensor})
            return
        if tuple(tensor.shape) != held.shape:
            first = next(iter(held.tensors.values()))
            raise ShapeMismatchError(
                f"{tensor.describe()}: expected shape {held.shape} (the shape of {first.name!r}) for "
                f"{self.target}, found {tuple(tensor.shape)}"
            )
        held.tensors[item] = tensor

    def layouts(self, target_shape: Mapping[str, tuple[int, ...]], *, count: int | None) -> dict[str, Layout]:
        """The layout of each target (by full name) from the inputs held."""
        sources = self.converter.source_patterns
        targets = self.converter.target_patterns
        prefix, _, suffix = self.target.partition(targets[0])
        inputs = {index: (held.shape, sorted(held.tensors)) for index, held in self.sources.items()}
        try:
            by_pattern = follow_operations(self.converter.operations, sources, targets, inputs, count=count,
                                           target_shape=lambda pattern: target_shape[prefix + pattern + suffix])
        except UnfollowedOperation as exc:
            raise UnsupportedError(
                f"{self.label}: transformers converts {self.target} with an operation the transformers fallback "
                f"does not reproduce ({exc})"
            ) from None
        return {prefix + pattern + suffix: layout for pattern, layout in by_pattern.items()}

    def expected_count(self, target_shape: Mapping[str, tuple[int, ...]]) -> int | None:
        """Items per stacked source, read from the fused parameter's shape once every source has an input."""
        if self.count is None and len(self.sources) == len(self.converter.source_patterns):
            for name, layout in self.layouts(target_shape, count=None).items():
                dim = unknown_count_dim(layout)
                if dim is not None and name in target_shape:
                    self.count = target_shape[name][dim]
                    break
            else:
                self.count = 1
        return self.count

    def missing(self, target_shape: Mapping[str, tuple[int, ...]]) -> list[str]:
        """What the group still lacks, as messages name it (``expert 3 of pattern``, or ``pattern``)."""
        count = self.expected_count(target_shape)
        lacking = []
        for index, pattern in enumerate(self.converter.source_patterns):
            held = self.sources.get(index)
            if held is None:
                lacking.append(f"{pattern!r}")
            elif "*" in pattern and count is not None:
                lacking += [f"expert {item} ({_name_of_item(held, pattern, item)!r})"
                            for item in range(count) if item not in held.tensors]
        return lacking

    def is_complete(self, target_shape: Mapping[str, tuple[int, ...]]) -> bool:
        return not self.missing(target_shape) and self.count is not None
