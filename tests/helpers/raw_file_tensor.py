"""A raw file of values standing in for a format: :class:`RawFileTensor` offers its bytes as a
:class:`~loader.weights.FileSpan`, as the safetensors plugin does, so the mapping of parameters can be tested
without one."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from loader.weights import CheckpointTensor, FileSpan, ReadStats

__all__ = ["RawFileTensor", "write_raw"]


class RawFileTensor(CheckpointTensor):
    """Rows ``[first, first + rows)`` of a ``(total_rows, cols)`` tensor stored raw at ``offset`` of ``path``."""

    def __init__(self, path: Path, offset: int, shape: tuple[int, int], dtype: torch.dtype,
                 stats: ReadStats | None = None, first: int = 0, rows: int | None = None,
                 cols: tuple[int, int] | None = None) -> None:
        self.path, self.offset, self.full, self._dtype, self.stats = path, offset, shape, dtype, stats
        self.first, self.rows = first, shape[0] if rows is None else rows
        self.cols = cols or (0, shape[1])
        self.name, self.file = f"raw@{offset}", str(path)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows, self.cols[1])

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def narrow(self, dim: int, start: int, length: int) -> RawFileTensor:
        dim = self.check_narrow(dim, start, length)
        if dim == 0:
            return RawFileTensor(self.path, self.offset, self.full, self._dtype, self.stats,
                                 self.first + start, length, self.cols)
        return RawFileTensor(self.path, self.offset, self.full, self._dtype, self.stats, self.first, self.rows,
                             (self.cols[0] + start, length))

    def _all(self) -> torch.Tensor:
        itemsize = torch.empty((), dtype=self._dtype).element_size()
        data = self.path.read_bytes()[self.offset:self.offset + self.full[0] * self.full[1] * itemsize]
        return torch.frombuffer(bytearray(data), dtype=self._dtype).view(self.full)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        values = self._all()[self.first:self.first + self.rows, self.cols[0]:self.cols[0] + self.cols[1]]
        return values.to(dtype or self._dtype).clone()

    def file_span(self) -> FileSpan | None:
        if self.cols != (0, self.full[1]):
            return None  # an inner-dim narrow is strided in the file
        itemsize = torch.empty((), dtype=self._dtype).element_size()
        row = self.full[1] * itemsize
        return FileSpan(str(self.path), self.offset + self.first * row, self.rows * row, self.stats)


def write_raw(path: Path, tensors: list[torch.Tensor], lead: int, gap: int = 0) -> list[int]:
    """Write ``lead`` junk bytes, then each tensor's bytes followed by ``gap`` junk bytes; return offsets."""
    offsets, blob = [], bytearray(os.urandom(lead))
    for tensor in tensors:
        offsets.append(len(blob))
        blob += tensor.contiguous().view(torch.uint8).numpy().tobytes() + os.urandom(gap)
    path.write_bytes(bytes(blob))
    return offsets
