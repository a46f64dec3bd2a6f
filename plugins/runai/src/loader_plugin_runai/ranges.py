"""Which bytes of a file a narrowed safetensors tensor is: the ranges the streamer is asked for.

A tensor is stored row-major, so narrowing its leading dimension (a column-parallel
shard, one part of a fused q/k/v) keeps one run of bytes, and narrowing an inner one
(a row-parallel shard) keeps one run per index of the dimensions before it. Each run
is one range of the streamer's request, with its own destination: the runs follow one
another in the destination exactly as a contiguous tensor of the narrowed shape holds
them, so a rank fetches only the bytes it keeps and they land where they belong.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

__all__ = ["ByteRanges", "Narrow", "byte_ranges"]

Narrow = tuple[int, int, int]
"""``(dim, start, length)``, as :meth:`~loader.weights.CheckpointTensor.narrow` takes them."""


@attrs.frozen
class ByteRanges:
    """File offsets and sizes of the runs of a (narrowed) tensor, in the order a contiguous copy holds them."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    def split(self, limit: int, itemsize: int) -> list[ByteRanges]:
        """Consecutive groups of at most ``limit`` bytes (a run longer than that is cut at an element boundary)."""
        piece = max(itemsize, limit // itemsize * itemsize)
        groups: list[ByteRanges] = []
        offsets: list[int] = []
        sizes: list[int] = []
        used = 0
        for offset, size in zip(self.offsets, self.sizes, strict=True):
            while size:
                if used == piece:
                    groups.append(ByteRanges(tuple(offsets), tuple(sizes)))
                    offsets, sizes, used = [], [], 0
                take = min(size, piece - used)
                offsets.append(offset)
                sizes.append(take)
                used += take
                offset += take
                size -= take
        if sizes:
            groups.append(ByteRanges(tuple(offsets), tuple(sizes)))
        return groups


def byte_ranges(begin: int, shape: Sequence[int], itemsize: int, narrows: Sequence[Narrow]) -> ByteRanges:
    """The runs of a tensor stored from ``begin`` with ``shape``, after applying ``narrows`` in order."""
    starts = [0] * len(shape)
    lengths = list(shape)
    for dim, start, length in narrows:
        starts[dim] += start
        lengths[dim] = length
    if 0 in lengths:
        return ByteRanges((), ())
    strides = [itemsize] * len(shape)
    for dim in range(len(shape) - 2, -1, -1):
        strides[dim] = strides[dim + 1] * shape[dim + 1]
    inner = max((d for d in range(len(shape)) if lengths[d] != shape[d]), default=0)
    segment = lengths[inner] * strides[inner] if shape else itemsize
    first = begin + sum(s * stride for s, stride in zip(starts, strides, strict=True))
    outer = [range(lengths[d]) for d in range(inner)]
    offsets = tuple(first + sum(i * strides[d] for d, i in enumerate(index)) for index in itertools.product(*outer))
    return ByteRanges(offsets, (segment,) * len(offsets))
