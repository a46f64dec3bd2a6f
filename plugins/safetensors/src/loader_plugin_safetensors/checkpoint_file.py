"""``SafetensorsFile``: one safetensors file's validated header and lazy tensor handles.

The module API other plugins and tools reuse (``loader inspect``'s dtype
histograms, sharded-state save/load): :func:`open_checkpoint_file` reads and
validates the header and returns handles that read nothing until asked. The
file descriptor is opened per read unless the file is *held* (``with
open_checkpoint_file(path) as f:`` or :meth:`SafetensorsFile.hold`), which is
what the weight iterator does while it walks a file.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from types import TracebackType

from loader.checkpoint import SafetensorsHeader, SafetensorsTensorInfo
from loader.checkpoint import read_safetensors_file_header as read_header
from loader.errors import CheckpointFormatError
from loader.weights import ReadStats

from .file_access import SharedDescriptor
from .tensor import SafetensorsTensor

__all__ = ["SafetensorsFile", "open_checkpoint_file"]


class SafetensorsFile:
    """A safetensors file: :attr:`header`, :attr:`metadata` and one handle per tensor in file order."""

    def __init__(self, header: SafetensorsHeader, descriptor: SharedDescriptor,
                 stats: ReadStats | None = None) -> None:
        self.header = header
        self.descriptor = descriptor
        self.stats = stats

    @property
    def path(self) -> str:
        return self.header.path

    @property
    def metadata(self) -> Mapping[str, str]:
        return self.header.metadata

    @property
    def infos(self) -> Mapping[str, SafetensorsTensorInfo]:
        """Header entries by name, in the order their bytes appear in the file."""
        return self.header.tensors

    def names(self) -> list[str]:
        return list(self.header.tensors)

    def __len__(self) -> int:
        return len(self.header.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.header.tensors

    def tensor(self, name: str) -> SafetensorsTensor:
        """The handle for ``name``; :class:`~loader.errors.CheckpointFormatError` if the file lacks it."""
        info = self.header.tensors.get(name)
        if info is None:
            raise CheckpointFormatError(f"{self.path}: no tensor named {name!r}")
        return SafetensorsTensor(self.descriptor, info, self.stats)

    def tensors(self) -> Iterator[tuple[str, SafetensorsTensor]]:
        """``(name, handle)`` for every tensor, in file order (reads then sweep the file forward)."""
        for name, info in self.header.tensors.items():
            yield name, SafetensorsTensor(self.descriptor, info, self.stats)

    def hold(self) -> None:
        """Keep the descriptor open across reads until :meth:`release`."""
        self.descriptor.hold()

    def release(self) -> None:
        self.descriptor.release()

    def __enter__(self) -> SafetensorsFile:
        self.hold()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"SafetensorsFile({self.path!r}, tensors={len(self)})"


def open_checkpoint_file(path: str | os.PathLike[str], stats: ReadStats | None = None) -> SafetensorsFile:
    """Read and validate the header of ``path``; the file is not kept open.

    :param path: a ``.safetensors`` file.
    :param stats: counts the bytes later reads take, or ``None``.
    :raises CheckpointFormatError: if the file cannot be opened or its header is malformed.
    """
    descriptor = SharedDescriptor(os.fspath(path))
    with descriptor.borrow() as fd:
        header = read_header(descriptor.path, fd)
    return SafetensorsFile(header, descriptor, stats)
