"""Which bytes of a tensor a narrowed view needs, as one regular grid of equal segments.

A row-major tensor narrowed along any dims reads a set of equal-length
contiguous segments whose start offsets form a regular grid: the innermost
dims that are kept whole merge into the segment, the first narrowed dim from
the right sets its length, and the dims to its left repeat it with their
strides. A narrow on dim 0 (or any narrow whose outer dims have one index)
is therefore a single range; a narrow on an inner dim is ``rows`` segments.
The grid form lets a reader pick its strategy (one ``preadv``, one per segment,
or a strided copy out of a memory map) without ever listing offsets in Python.
"""

from __future__ import annotations

import attrs

__all__ = ["ByteLayout", "layout_of"]


@attrs.frozen
class ByteLayout:
    """``segment``-byte runs at ``offset + sum(i_k * stride_k)`` for each grid index.

    ``grid`` holds ``(count, stride)`` pairs, outermost first; an empty grid is
    one contiguous range. Segments are listed in row-major order, which is the
    order their bytes take in a contiguous destination.
    """

    offset: int
    segment: int
    grid: tuple[tuple[int, int], ...] = ()

    @property
    def segments(self) -> int:
        n = 1
        for count, _ in self.grid:
            n *= count
        return n

    @property
    def nbytes(self) -> int:
        return self.segments * self.segment

    @property
    def end(self) -> int:
        """One past the last byte any segment touches."""
        if self.nbytes == 0:
            return self.offset
        return self.offset + sum((count - 1) * stride for count, stride in self.grid) + self.segment

    @property
    def contiguous(self) -> bool:
        return not self.grid


def layout_of(
    offset: int, shape: tuple[int, ...], itemsize: int, view: tuple[tuple[int, int], ...]
) -> ByteLayout:
    """The bytes a view ``[(start, length) per dim]`` of a row-major tensor needs.

    :param offset: absolute file offset of the whole tensor's first byte.
    :param shape: the whole tensor's shape.
    :param itemsize: bytes per element.
    :param view: ``(start, length)`` for each dim of ``shape``.
    """
    strides = [0] * len(shape)
    step = itemsize
    for dim in range(len(shape) - 1, -1, -1):
        strides[dim] = step
        step *= shape[dim]
    if any(length == 0 for _, length in view):
        return ByteLayout(offset, 0)
    start_offset = offset + sum(start * stride for (start, _), stride in zip(view, strides, strict=True))
    segment = itemsize
    dim = len(shape) - 1
    # innermost whole dims merge into the segment; the first narrowed one ends it
    while dim >= 0:
        length = view[dim][1]
        segment = length * strides[dim]
        dim -= 1
        if length != shape[dim + 1]:
            break
    grid: list[tuple[int, int]] = []
    for outer in range(dim + 1):
        count = view[outer][1]
        if count == 1:
            continue
        stride = strides[outer]
        if grid and grid[-1][1] == count * stride:
            grid[-1] = (grid[-1][0] * count, stride)
        else:
            grid.append((count, stride))
    return ByteLayout(start_offset, segment, tuple(grid))
