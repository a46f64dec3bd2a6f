"""Read back the part files :mod:`loader._sharded.writer` wrote, with no format plugin.

The core writes sharded state itself, so it reads it itself: a sharded-state
folder loads with any set of plugins installed (no reader of the
``safetensors`` format needed). A part file is checked as any safetensors
file is: its header passes the one parser every reader shares
(:mod:`loader._safetensors_header`). Tensors offer their bytes as a
:class:`~loader.weights.FileSpan`, so CPU loads map them as the safetensors
reader's do; otherwise they are read with positioned reads.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .._file_reads import read_file_range
from .._safetensors_dtypes import DTYPES
from .._safetensors_header import read_file_header
from ..weights import CheckpointTensor, EagerTensor, FileSpan, ReadStats

if TYPE_CHECKING:
    import torch

__all__ = ["StoredTensor", "iter_part_files", "read_part_header"]


def _dtype(code: str) -> torch.dtype:
    return DTYPES[code].torch_dtype()


class StoredTensor(CheckpointTensor):
    """A contiguous tensor at ``offset`` of a part file; narrowing dim 0 only moves the offset."""

    def __init__(self, path: str, name: str, offset: int, shape: tuple[int, ...], dtype: torch.dtype,
                 stats: ReadStats) -> None:
        self.file = path
        self.name = name
        self.offset = offset
        self._shape = shape
        self._dtype = dtype
        self.stats = stats

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim = self.check_narrow(dim, start, length)
        if dim != 0:
            return EagerTensor(self.read(), self.name, self.file).narrow(dim, start, length)
        row = self.nbytes // self._shape[0] if self._shape[0] else 0
        return StoredTensor(self.file, self.name, self.offset + start * row, (length, *self._shape[1:]),
                            self._dtype, self.stats)

    def file_span(self) -> FileSpan | None:
        return FileSpan(self.file, self.offset, self.nbytes, self.stats)

    def _fill(self, out: torch.Tensor) -> None:
        """Read this tensor's bytes into ``out`` (contiguous, CPU, this tensor's dtype and shape)."""
        import torch

        nbytes = self.nbytes
        if nbytes:
            view = memoryview(out.view(-1).view(torch.uint8).numpy().data).cast("B")
            read_file_range(self.file, view, self.offset, f"tensor {self.name!r}")
        self.stats.add(nbytes, 1)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        import torch

        values = torch.empty(self._shape, dtype=self._dtype)
        self._fill(values)
        return values if dtype is None or dtype == self._dtype else values.to(dtype)

    def read_into(self, out: torch.Tensor) -> None:
        self.check_destination(out)
        if out.device.type == "cpu" and out.dtype == self._dtype and out.is_contiguous():
            self._fill(out.detach())
        else:
            out.copy_(self.read())


def read_part_header(path: str) -> list[tuple[str, str, tuple[int, ...], int]]:
    """The part file's tensors as ``(name, dtype code, shape, absolute offset)`` in file order.

    The header is checked by the one safetensors parser (:mod:`loader._safetensors_header`): a part
    file whose tensors overlap, leave gaps or run past its end is refused as any safetensors file is.
    """
    header = read_file_header(path)
    return [(t.name, t.dtype.code, t.shape, t.begin) for t in header.tensors.values()]


def iter_part_files(files: tuple[str, ...], stats: ReadStats) -> Iterator[tuple[str, CheckpointTensor]]:
    """Every tensor of the part files, in file order, unread."""
    for path in files:
        for name, code, shape, offset in read_part_header(path):
            yield name, StoredTensor(path, name, offset, shape, _dtype(code), stats)
