"""Tensors of a plain (unencrypted) ``.tensors`` file, read straight from their bytes.

tensorizer stores each tensor's values contiguously, row-major, at the
offset its index gives, so a rank narrowed on dim 0 (column-parallel
layers, the vocabulary) reads only its own rows, and an unconverted read
goes straight into the parameter. Where the bytes come from is a
:class:`ByteSource`: a local file (positioned reads on the I/O pool, and a
:class:`~loader.weights.FileSpan` so a mapped load can map it) or a remote
file's :class:`~.remote_stream.RemoteStream` (read front to back).

A narrow on another dim (row-parallel layers) keeps rows whole on disk: the
rows are read into a staging buffer that one thread reuses from tensor to
tensor (fresh memory is slow to fault in; the largest tensor's worth is
allocated once), and this rank's columns are copied out of it. Nothing handed
out may alias that buffer: :meth:`PlainTensor.read` returns a copy, and
:meth:`PlainTensor.read_into` copies into the destination before the buffer is
used again.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

from loader.io import read_file_range
from loader.weights import CheckpointTensor, FileSpan, ReadStats

from .index import TensorEntry

if TYPE_CHECKING:
    import torch

__all__ = ["ByteSource", "LocalFile", "PlainTensor", "StagingBuffer"]


class ByteSource(Protocol):
    """Where a plain file's bytes are read from."""

    name: str
    """The file's path or URI, for messages."""
    mappable: bool
    """Whether :attr:`name` is a local file a mapped load may map."""

    def read_into(self, view: memoryview, offset: int, what: str) -> None:
        """Fill ``view`` with the file's bytes from ``offset``; a short file raises naming ``what``."""


class LocalFile:
    """A local file, read by positioned reads (large ones split over the I/O pool)."""

    mappable = True

    def __init__(self, path: str) -> None:
        self.name = path

    def read_into(self, view: memoryview, offset: int, what: str) -> None:
        read_file_range(self.name, view, offset, what)


class StagingBuffer(threading.local):
    """One growing byte buffer per thread, reused by every strided read on that thread."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of this thread's buffer (grown when too small); its previous contents are gone."""
        import torch

        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = torch.empty(nbytes, dtype=torch.uint8)
        return self.buffer[:nbytes]


STAGING = StagingBuffer()


class PlainTensor(CheckpointTensor):
    """A tensor of a plain file: ``rows`` of its dim 0 at ``offset``, then column ``narrows`` applied on read."""

    def __init__(self, source: ByteSource, entry: TensorEntry, dtype: torch.dtype, stats: ReadStats, *,
                 offset: int | None = None, shape: tuple[int, ...] | None = None,
                 narrows: tuple[tuple[int, int, int], ...] = ()) -> None:
        self.source = source
        self.file = source.name
        self.name = entry.name
        self.entry = entry
        self._dtype = dtype
        self.stats = stats
        self.offset = entry.data_offset if offset is None else offset
        self.stored_shape = entry.shape if shape is None else shape
        """The shape on disk of what this handle reads: dim 0 narrowed, the other dims whole."""
        self.narrows = narrows
        logical = list(self.stored_shape)
        for dim, _, length in narrows:
            logical[dim] = length
        self._shape = tuple(logical)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def stored_bytes(self) -> int:
        """Bytes of the rows this handle reads from the file."""
        count = 1
        for size in self.stored_shape:
            count *= size
        return count * self._dtype.itemsize

    def narrow(self, dim: int, start: int, length: int) -> PlainTensor:
        dim = self.check_narrow(dim, start, length)
        if start == 0 and length == self._shape[dim]:
            return self  # a row-parallel layer at tp=1 asks for every column: read (or map) the rows directly
        if dim == 0 and not self.narrows:
            row = self.stored_bytes // self.stored_shape[0] if self.stored_shape[0] else 0
            return PlainTensor(self.source, self.entry, self._dtype, self.stats, offset=self.offset + start * row,
                               shape=(length, *self.stored_shape[1:]))
        return PlainTensor(self.source, self.entry, self._dtype, self.stats, offset=self.offset,
                           shape=self.stored_shape, narrows=(*self.narrows, (dim, start, length)))

    def file_span(self) -> FileSpan | None:
        if self.narrows or not self.source.mappable:
            return None
        return FileSpan(self.file, self.offset, self.stored_bytes, self.stats)

    def _read_rows(self, out: torch.Tensor) -> None:
        """Read the stored rows into ``out`` (contiguous CPU, the stored dtype and shape, or raw bytes)."""
        import torch

        nbytes = self.stored_bytes
        if nbytes:
            view = memoryview(out.view(-1).view(torch.uint8).numpy().data).cast("B")
            self.source.read_into(view, self.offset, f"tensor {self.name!r}")
        self.stats.add(nbytes, 1)

    def _staged(self) -> torch.Tensor:
        """The narrowed values as a view of this thread's staging buffer: valid until its next use."""
        rows = STAGING.take(self.stored_bytes)
        self._read_rows(rows)
        values = rows.view(self._dtype).view(self.stored_shape)
        for dim, start, length in self.narrows:
            values = values.narrow(dim, start, length)
        return values

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        import torch

        out = torch.empty(self._shape, dtype=dtype or self._dtype)
        self.read_into(out)
        return out

    def read_into(self, out: torch.Tensor) -> None:
        import torch

        self.check_destination(out)
        direct = not self.narrows and out.device.type == "cpu" and out.dtype == self._dtype and out.is_contiguous()
        with torch.no_grad():
            if direct:
                self._read_rows(out.detach())
            else:
                out.detach().copy_(self._staged())
