"""Tensors known from their headers only: what ``loader inspect`` lists without fetching weights.

When the caller says it reads shapes and dtypes only
(``options.extra["headers_only"]``), the stream is built from each file's
header (two ranged reads per object, :mod:`.header`) and its handles refuse
to be read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from loader.weights import CheckpointTensor, ReadStats

from .header import HeaderEntry, read_header
from .uri import parse_object_uri

if TYPE_CHECKING:
    import torch

__all__ = ["DeclaredTensor", "iter_declared_tensors"]


class DeclaredTensor(CheckpointTensor):
    """A tensor's name, dtype and shape from a header; its values were not fetched."""

    def __init__(self, entry: HeaderEntry, file: str, shape: tuple[int, ...] | None = None) -> None:
        self.entry = entry
        self.name = entry.name
        self.file = file
        self._shape = entry.shape if shape is None else shape

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        import torch

        found = getattr(torch, self.entry.torch_name)
        assert isinstance(found, torch.dtype)
        return found

    @property
    def stored_type(self) -> str:
        return self.entry.torch_name

    def narrow(self, dim: int, start: int, length: int) -> DeclaredTensor:
        dim = self.check_narrow(dim, start, length)
        shape = list(self._shape)
        shape[dim] = length
        return DeclaredTensor(self.entry, self.file, tuple(shape))

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        raise RuntimeError(f"{self.describe()}: only its header was read (a headers-only stream)")


def _local_reader(path: str) -> Callable[[int, int], bytes]:
    def read_range(start: int, length: int) -> bytes:
        with open(path, "rb") as fh:
            fh.seek(start)
            return fh.read(length)

    return read_range


def iter_declared_tensors(files: Sequence[str], stats: ReadStats) -> Iterator[tuple[str, DeclaredTensor]]:
    """``(name, DeclaredTensor)`` for every tensor of ``files`` (local paths or ``s3://`` URIs), headers only."""
    from .object_store import ObjectStore

    stores: dict[str, ObjectStore] = {}
    for file in files:
        if "://" in file:
            uri = parse_object_uri(file.rsplit("/", 1)[0])
            name = file.rsplit("/", 1)[1]
            store = stores.get(str(uri))
            if store is None:  # one client per prefix (setdefault would build one per file)
                store = stores[str(uri)] = ObjectStore(uri)
            size = store.head(name).size

            def read_range(start: int, length: int, store: ObjectStore = store, name: str = name) -> bytes:
                data = store.read_range(name, start, length)
                stats.add(len(data))
                return data

            entries = read_header(read_range, size, file)
        else:
            entries = read_header(_local_reader(file), os.path.getsize(file), file)
        for entry in entries:
            yield entry.name, DeclaredTensor(entry, file)
