"""Read a :class:`~.byte_layout.ByteLayout` from a file into a contiguous buffer, fast.

Three strategies, chosen from the layout alone:

- one contiguous range: ``os.preadv`` straight into the destination; ranges of
  :data:`PARALLEL_MIN_BYTES` or more are split into :data:`CHUNK_BYTES` pieces
  read by a small thread pool (``preadv`` releases the GIL, and several reads
  in flight keep a page cache copy or an NVMe queue busier than one);
- equal segments of at least :data:`SEGMENT_PREAD_MIN_BYTES`: one ``preadv``
  per segment, spread over the pool the same way;
- many small segments (a narrow on an inner dim, a row-parallel shard): one
  ``preadv`` per block of rows in compiled code, its iovecs the destination's
  row slices with the gaps between them sent to one scratch buffer, so the
  kept bytes are copied once, straight into place
  (:func:`loader.io.gather_rows`); without a compiler, or for grids of more
  than one dimension, blocks of rows are read whole, gaps included, into a
  reused bounce buffer of about :data:`CHUNK_BYTES` and the segments copied
  out with numpy's strided copy (benchmarks/RESULTS.md). Not a map either
  way: a file cut short while it is read must give a short read (an error),
  not a ``SIGBUS``.

The threads are the core's shared pool (:mod:`loader.io`, ``LOADER_READ_THREADS``).

The caller counts bytes; this module only moves them. A file that ends before
the bytes the header promised raises :class:`~loader.errors.CheckpointFormatError`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import partial

import numpy as np

from loader.io import fused_reads_available, gather_rows, pread_exactly, run_in_pool
from loader.io import io_pool as read_pool
from loader.io import io_threads as read_threads

from .byte_layout import ByteLayout
from .staging import staging_buffer

__all__ = [
    "CHUNK_BYTES",
    "GATHER_MIN_BLOCK_BYTES",
    "PARALLEL_MIN_BYTES",
    "SEGMENT_PREAD_MIN_BYTES",
    "read_layout",
    "read_pool",
    "read_threads",
    "run_in_pool",
]

CHUNK_BYTES = 8 << 20
"""Size of the pieces a large contiguous range is split into, one per pool task."""

PARALLEL_MIN_BYTES = 16 << 20
"""Ranges smaller than this are read by the calling thread alone."""

GATHER_MIN_BLOCK_BYTES = 1 << 20
"""File bytes below which a compiled gather is not split further over the pool."""

SEGMENT_PREAD_MIN_BYTES = 256 << 10
"""Segments at least this long are read with one ``preadv`` each; shorter ones are gathered (never from a map)."""

def _split(total: int, piece: int) -> Iterator[tuple[int, int]]:
    for start in range(0, total, piece):
        yield start, min(total, start + piece)


def read_layout(fd: int, layout: ByteLayout, dest: np.ndarray, *, path: str, what: str) -> None:
    """Read the bytes ``layout`` describes into ``dest`` (contiguous ``uint8``, ``layout.nbytes`` long).

    :param fd: an open descriptor of ``path``.
    :param layout: which bytes, from :func:`~.byte_layout.layout_of`.
    :param dest: where they go, in row-major segment order.
    :param path: the file, for errors.
    :param what: the tensor, for errors.
    """
    total = layout.nbytes
    if total == 0:
        return
    view = dest.data.cast("B")
    if layout.contiguous:
        if total < PARALLEL_MIN_BYTES:
            pread_exactly(fd, view, layout.offset, path, what)
            return
        run_in_pool([
            partial(pread_exactly, fd, view[a:b], layout.offset + a, path, what)
            for a, b in _split(total, CHUNK_BYTES)
        ])
        return
    if layout.segment >= SEGMENT_PREAD_MIN_BYTES:
        _read_segments(fd, layout, view, path, what)
    elif len(layout.grid) == 1 and fused_reads_available():
        _gather_in_place(fd, layout, dest, path, what)
    else:
        _gather_through_buffer(fd, layout, dest, path, what)


def _segment_offsets(layout: ByteLayout) -> Iterator[int]:
    axes = [range(0, count * stride, stride) for count, stride in layout.grid]
    for parts in itertools.product(*axes):
        yield layout.offset + sum(parts)


def _read_segments(fd: int, layout: ByteLayout, view: memoryview, path: str, what: str) -> None:
    seg = layout.segment
    offsets = list(_segment_offsets(layout))
    per_task = max(1, CHUNK_BYTES // seg)

    def read_group(first: int, last: int) -> None:
        for i in range(first, last):
            pread_exactly(fd, view[i * seg:(i + 1) * seg], offsets[i], path, what)

    run_in_pool([partial(read_group, a, b) for a, b in _split(len(offsets), per_task)])


def _gather_in_place(fd: int, layout: ByteLayout, dest: np.ndarray, path: str, what: str) -> None:
    """Blocks of rows over the pool (at most :data:`CHUNK_BYTES` of file a block, at least
    :data:`GATHER_MIN_BLOCK_BYTES`, else one per pool thread), each one compiled gather into ``dest``."""
    ((rows, row_stride),) = layout.grid
    seg, address = layout.segment, dest.ctypes.data
    span = rows * row_stride
    per_task = max(1, min(CHUNK_BYTES, max(GATHER_MIN_BLOCK_BYTES, -(-span // read_threads()))) // row_stride)
    run_in_pool([partial(gather_rows, fd, layout.offset + a * row_stride, b - a, row_stride, seg, address + a * seg,
                         path=path, what=what) for a, b in _split(rows, per_task)])


def _gather_through_buffer(fd: int, layout: ByteLayout, dest: np.ndarray, path: str, what: str) -> None:
    """Read blocks of rows (outermost grid index) whole into bounce buffers, copy their segments out."""
    rows, row_stride = layout.grid[0]
    inner = ByteLayout(0, layout.segment, layout.grid[1:])
    counts = tuple(count for count, _ in layout.grid)
    target = dest.reshape(*counts, layout.segment)
    per_block = max(1, CHUNK_BYTES // max(row_stride, inner.end))

    def gather(first: int, last: int) -> None:
        span = (last - first - 1) * row_stride + inner.end
        buffer = staging_buffer(4, span).numpy()  # this thread's own slot: 0-3 belong to tensor_read
        pread_exactly(fd, buffer.data.cast("B"), layout.offset + first * row_stride, path, what)
        source = np.ndarray((last - first, *counts[1:], layout.segment), dtype=np.uint8, buffer=buffer,
                            strides=(row_stride, *(stride for _, stride in layout.grid[1:]), 1))
        np.copyto(target[first:last], source)

    run_in_pool([partial(gather, a, b) for a, b in _split(rows, per_block)])
