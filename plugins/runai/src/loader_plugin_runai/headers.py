"""Each file's safetensors header, read and checked by the core's parser before anything is streamed.

The streamer parses headers itself, with fewer rules than the safetensors
format (an object's trailing bytes or a tensor past its end go unnoticed on
``s3://``) and with messages of its own. Reading the headers first through
:func:`loader.checkpoint.read_safetensors_header` refuses the same files the
local reader refuses, with the same message naming the object, before a byte
of tensor data moves; it is also all ``loader inspect`` reads. An object costs
two ranged GETs (the 8-byte length, then the header), its size comes from the
listing (no HEAD), and every object of a prefix shares the snapshot's client.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from loader.checkpoint import SafetensorsHeader, read_safetensors_file_header, read_safetensors_header
from loader.weights import HeaderOnlyTensor, ReadStats

from .identity import Snapshot
from .stores import Store, open_store
from .uri import parse_object_uri

__all__ = ["iter_declared_tensors", "read_headers"]


def _object_header(file: str, store: Store, size: int, stats: ReadStats | None) -> SafetensorsHeader:
    name = file[len(store.uri.join("")):]

    def read_range(start: int, length: int) -> bytes:
        data = store.read_range(name, start, length)
        if stats is not None:
            stats.add(len(data))
        return data

    return read_safetensors_header(read_range, size, file)


def read_headers(files: Sequence[str], snapshot: Snapshot | None,
                 stats: ReadStats | None = None) -> Iterator[SafetensorsHeader]:
    """The validated header of each of ``files`` (local paths, or ``s3://`` URIs the snapshot lists), in order.

    :param stats: counts the header bytes fetched when they are what is being read (``loader inspect``);
        a load's statistics count tensor bytes, so its check passes none.

    :raises CheckpointFormatError: naming the file, for the first malformed header.
    """
    for file in files:
        if "://" not in file:
            yield read_safetensors_file_header(file)
            continue
        if snapshot is not None and snapshot.store is not None and file in snapshot.files:
            yield _object_header(file, snapshot.store, snapshot.files[file].size, stats)
            continue
        prefix, _, name = file.rpartition("/")  # not listed by this load: one client and a HEAD for it
        store = open_store(parse_object_uri(prefix))
        yield _object_header(file, store, store.head(name).size, stats)


def iter_declared_tensors(
    files: Sequence[str], snapshot: Snapshot | None, stats: ReadStats
) -> Iterator[tuple[str, HeaderOnlyTensor]]:
    """``(name, HeaderOnlyTensor)`` for every tensor of ``files``, in file order, from their headers alone."""
    for header in read_headers(files, snapshot, stats):
        for info in header.tensors.values():
            yield info.name, HeaderOnlyTensor(info.name, header.path, info.dtype, info.shape)
