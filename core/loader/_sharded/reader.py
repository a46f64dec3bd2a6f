"""Read back the part files :mod:`loader._sharded.writer` wrote, with no format plugin.

The core writes sharded state itself, so it reads it itself: a sharded-state
folder loads with any set of plugins installed (no reader of the
``safetensors`` format needed). Only the subset the writer produces is
accepted: a JSON header of ``{"dtype", "shape", "data_offsets"}`` entries whose
spans match their shapes and lie inside the file. Tensors offer their bytes as a
:class:`~loader.weights.FileSpan`, so CPU loads map them as the safetensors
reader's do; otherwise they are read with positioned reads.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .._file_reads import pread_exactly
from ..errors import CheckpointFormatError
from ..weights import CheckpointTensor, EagerTensor, FileSpan, ReadStats

if TYPE_CHECKING:
    import torch

__all__ = ["StoredTensor", "iter_part_files", "read_part_header"]

MAX_HEADER_BYTES = 100_000_000


@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    """Code -> dtype, the writer's table read backwards (imported here on first use: it needs torch)."""
    from .writer import DTYPE_CODES

    return {code: dtype for dtype, code in DTYPE_CODES.items()}


def _dtype(code: str) -> torch.dtype:
    return _dtypes()[code]


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
            fd = os.open(self.file, os.O_RDONLY)
            try:
                view = memoryview(out.view(-1).view(torch.uint8).numpy().data).cast("B")
                pread_exactly(fd, view, self.offset, self.file, f"tensor {self.name!r}")
            finally:
                os.close(fd)
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


def _entry(path: str, name: str, raw: Any, data_start: int, file_size: int) -> tuple[str, tuple[int, ...], int]:
    """``(dtype code, shape, absolute offset)`` of one header entry, or an error naming the tensor."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(raw, dict):
        raise CheckpointFormatError(f"{where}: header entry must be an object, found {type(raw).__name__}")
    code, shape, offsets = raw.get("dtype"), raw.get("shape"), raw.get("data_offsets")
    if code not in _dtypes():
        raise CheckpointFormatError(f"{where}: dtype {code!r} is not one of {', '.join(_dtypes())}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise CheckpointFormatError(f"{where}: shape must be a list of non-negative integers, found {shape!r}")
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
        raise CheckpointFormatError(f"{where}: data_offsets must be two integers, found {offsets!r}")
    numel = 1
    for s in shape:
        numel *= s
    nbytes = numel * _dtype(code).itemsize
    begin, end = offsets
    if begin < 0 or end - begin != nbytes:
        raise CheckpointFormatError(
            f"{where}: data_offsets {offsets} hold {end - begin} bytes, but {code} {tuple(shape)} needs {nbytes}"
        )
    if data_start + end > file_size:
        raise CheckpointFormatError(
            f"{where}: data ends at byte {data_start + end}, past the end of the file ({file_size} bytes)"
        )
    return code, tuple(shape), data_start + begin


def read_part_header(path: str) -> list[tuple[str, str, tuple[int, ...], int]]:
    """The part file's tensors as ``(name, dtype code, shape, absolute offset)`` in file order."""
    try:
        with open(path, "rb") as fh:
            file_size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise CheckpointFormatError(f"{path}: {len(prefix)} bytes, too short for a safetensors header")
            length = int.from_bytes(prefix, "little")
            if length > min(MAX_HEADER_BYTES, file_size - 8):
                raise CheckpointFormatError(
                    f"{path}: header length {length} is larger than the file or the {MAX_HEADER_BYTES} allowed"
                )
            raw = fh.read(length)
    except OSError as exc:
        raise CheckpointFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise CheckpointFormatError(f"{path}: header is not UTF-8 JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise CheckpointFormatError(f"{path}: header must be a JSON object, found {type(header).__name__}")
    entries = [(name, *_entry(path, name, raw, 8 + length, file_size))
               for name, raw in header.items() if name != "__metadata__"]
    return sorted(entries, key=lambda e: e[3])


def iter_part_files(files: tuple[str, ...], stats: ReadStats) -> Iterator[tuple[str, CheckpointTensor]]:
    """Every tensor of the part files, in file order, unread."""
    for path in files:
        for name, code, shape, offset in read_part_header(path):
            yield name, StoredTensor(path, name, offset, shape, _dtype(code), stats)
