"""transformers' weight-conversion operations, followed on shapes: where each checkpoint tensor lands.

transformers 5 converts checkpoint tensors while loading (stacks each expert's
matrix into one 3-D parameter, concatenates gate and up, splits a fused qkv)
by running a converter's operations on the tensors themselves. The fallback
never builds those intermediate tensors: it runs the same operations on
:class:`Layout` records (which region of the result each input fills, and
which of the input's dims each result dim shows), so each checkpoint tensor is
later read once, narrowed to the part its destination needs, straight into the
parameter. Only operations whose effect is a placement are followed
(``MergeModulelist``, ``Concatenate``, ``Chunk``, ``Split``, ``Transpose``);
any other is refused by name (:class:`UnfollowedOperation`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import attrs
from transformers.core_model_loading import Chunk, Concatenate, MergeModulelist, Split, Transpose

__all__ = ["Layout", "Piece", "UnfollowedOperation", "follow_operations", "unknown_count_dim"]

UNKNOWN = -1
"""The size of a stacking dim whose item count is not known yet (read from the parameter afterwards)."""


class UnfollowedOperation(Exception):
    """A converter uses an operation that is not a placement (its name is the message)."""


@attrs.frozen
class Piece:
    """One input tensor's share of a layout."""

    source: int
    """Index of the converter's source pattern the input matched."""
    item: int
    """Its position in that source's list (the expert index; 0 for a single tensor)."""
    dims: tuple[int | None, ...]
    """For each layout dim, the input dim it shows, or ``None`` for a unit dim added by stacking."""
    region: tuple[tuple[int, int], ...]
    """``(start, length)`` per layout dim."""
    narrows: tuple[tuple[int, int, int], ...] = ()
    """``(input dim, start, length)`` to apply to the input first (a chunk keeps only part of it)."""


@attrs.frozen
class Layout:
    """A tensor the operations produce, described by where its pieces come from."""

    shape: tuple[int, ...]
    pieces: tuple[Piece, ...]


def _input(source: int, item: int, shape: Sequence[int]) -> Layout:
    dims = tuple(range(len(shape)))
    return Layout(tuple(shape), (Piece(source, item, dims, tuple((0, size) for size in shape)),))


def _stack(layouts: Sequence[Layout], dim: int, count: int | None) -> Layout:
    first = layouts[0]
    shape = list(first.shape)
    shape.insert(dim, UNKNOWN if count is None else count)
    pieces = []
    for layout in layouts:
        for piece in layout.pieces:
            dims = list(piece.dims)
            dims.insert(dim, None)
            region = list(piece.region)
            region.insert(dim, (piece.item, 1))
            pieces.append(attrs.evolve(piece, dims=tuple(dims), region=tuple(region)))
    return Layout(tuple(shape), tuple(pieces))


def _concatenate(layouts: Sequence[Layout], dim: int) -> Layout:
    shape = list(layouts[0].shape)
    offset = 0
    pieces = []
    for layout in layouts:
        for piece in layout.pieces:
            region = list(piece.region)
            start, length = region[dim]
            region[dim] = (start + offset, length)
            pieces.append(attrs.evolve(piece, region=tuple(region)))
        offset += layout.shape[dim]
    shape[dim] = offset
    return Layout(tuple(shape), tuple(pieces))


def _part(layout: Layout, dim: int, start: int, length: int) -> Layout:
    """``layout`` narrowed to ``[start, start + length)`` along ``dim``: pieces cut where they cross its ends."""
    shape = list(layout.shape)
    shape[dim] = length
    pieces = []
    for piece in layout.pieces:
        begin, size = piece.region[dim]
        low, high = max(begin, start), min(begin + size, start + length)
        if low >= high:
            continue
        region = list(piece.region)
        region[dim] = (low - start, high - low)
        narrows = piece.narrows
        input_dim = piece.dims[dim]
        if input_dim is not None and (low, high) != (begin, begin + size):
            narrows = (*narrows, (input_dim, low - begin, high - low))
        pieces.append(attrs.evolve(piece, region=tuple(region), narrows=narrows))
    return Layout(tuple(shape), tuple(pieces))


def _transpose(layout: Layout, dim0: int, dim1: int) -> Layout:
    def swap(values: tuple) -> tuple:  # type: ignore[type-arg]
        items = list(values)
        items[dim0], items[dim1] = items[dim1], items[dim0]
        return tuple(items)

    pieces = tuple(attrs.evolve(p, dims=swap(p.dims), region=swap(p.region)) for p in layout.pieces)
    return Layout(swap(layout.shape), pieces)


def _single(values: Mapping[str, list[Layout]], what: str) -> list[Layout]:
    if len(values) != 1:
        raise UnfollowedOperation(f"{what} of {len(values)} inputs")
    return next(iter(values.values()))


def _apply(op: object, values: dict[str, list[Layout]], sources: list[str], targets: list[str],
           count: int | None, target_shape: Callable[[str], tuple[int, ...]]) -> dict[str, list[Layout]]:
    """One operation on layouts, keyed as transformers keys its tensors."""
    if isinstance(op, MergeModulelist):
        keys = {source: targets[0] if len(values) == 1 else source for source in values}
        return {keys[source]: [_stack(layouts, op.dim, count)] for source, layouts in values.items()}
    if isinstance(op, Concatenate) and op.num_shards_attribute is None and len(targets) == 1:
        ordered = [layout for source in sources for layout in values.get(source, [])]
        return {targets[0]: [_concatenate(ordered, op.dim)]}
    if isinstance(op, (Chunk, Split)) and getattr(op, "num_shards_attribute", None) is None:
        layout = _single(values, type(op).__name__)[0]
        if isinstance(op, Split):
            sizes = [target_shape(target)[op.dim] for target in targets]
        else:
            step = -(-layout.shape[op.dim] // len(targets))
            sizes = [min(step, layout.shape[op.dim] - step * i) for i in range(len(targets))]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return {target: [_part(layout, op.dim, start, size)]
                for target, start, size in zip(targets, starts, sizes, strict=True) if size > 0}
    if isinstance(op, Transpose):
        layout = _single(values, "Transpose")[0]
        key = sources[0] if len(targets) > 1 else targets[0]
        if op.check_dims and layout.shape == target_shape(targets[0]):
            return {key: [layout]}
        return {key: [_transpose(layout, op.dim0, op.dim1)]}
    raise UnfollowedOperation(repr(op))


def follow_operations(operations: Sequence[object], sources: list[str], targets: list[str],
                      inputs: Mapping[int, tuple[tuple[int, ...], Sequence[int]]], *, count: int | None,
                      target_shape: Callable[[str], tuple[int, ...]]) -> dict[str, Layout]:
    """The layout of each target pattern a converter's ``operations`` produce from ``inputs``.

    :param sources: the converter's source patterns; :param targets: its target patterns.
    :param inputs: source index -> ``(shape of one input, items present)``; a pattern with a ``*``
        has one item per expert, others one item, ``0``.
    :param count: items per stacked source, ``None`` while unknown (the stacked dim is then ``-1``,
        see :func:`unknown_count_dim`).
    :param target_shape: the parameter shape of a target pattern (``Split`` and checked ``Transpose`` ask).
    :raises UnfollowedOperation: naming an operation that is not a placement.
    """
    values: dict[str, list[Layout]] = {
        sources[index]: [_input(index, item, shape) for item in items] for index, (shape, items) in inputs.items()
    }
    for op in operations:
        values = _apply(op, values, sources, targets, count, target_shape)
    result: dict[str, Layout] = {}
    for key, layouts in values.items():
        if len(layouts) != 1:  # a list never merged: transformers would take its first tensor only
            raise UnfollowedOperation(f"{len(layouts)} tensors left unmerged for {key}")
        result[key] = layouts[0]
    return result


def unknown_count_dim(layout: Layout) -> int | None:
    """The dim of ``layout`` whose stacked item count is still unknown, if any."""
    return layout.shape.index(UNKNOWN) if UNKNOWN in layout.shape else None
