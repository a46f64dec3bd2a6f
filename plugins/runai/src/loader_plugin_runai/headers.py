"""Each file's safetensors header, read and checked by the core's parser before anything is streamed.

The streamer parses headers itself, with fewer rules than the safetensors
format (an object's trailing bytes or a tensor past its end go unnoticed on
``s3://``) and with messages of its own. Reading the headers first through
:func:`loader.checkpoint.read_safetensors_header` refuses the same files the
local reader refuses, with the same message naming the object, before a byte
of tensor data moves; it is also all ``loader inspect`` reads.

An object costs two ranged GETs (the 8-byte length, then the header; no tensor
byte, so a tensor-parallel rank still fetches only its own bytes), its size comes
from the listing (no HEAD), and every object of a prefix shares the snapshot's
client. The headers of a prefix are read at once (:data:`HEADER_READERS`
objects at a time): over a network a request costs a round trip whatever its
size, and a checkpoint of 30 shards read one header after another waited 60
round trips before its first tensor byte (on moto, 0.44 s of a 0.25 GB load's 2 s).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from loader.checkpoint import SafetensorsHeader, read_safetensors_file_header, read_safetensors_header
from loader.weights import HeaderOnlyTensor, ReadStats

from .identity import Snapshot
from .stores import Store, open_store
from .uri import parse_object_uri

__all__ = ["HEADER_READERS", "iter_declared_tensors", "read_headers"]

HEADER_READERS = 10
"""Header GETs in flight at once for the objects of one load: as many connections as the clients keep open
(boto3's and ``requests``' pools hold 10; a request beyond them opens and drops a connection of its own)."""


def _object_header(file: str, store: Store, size: int, stats: ReadStats | None) -> SafetensorsHeader:
    name = file[len(store.uri.join("")):]

    def read_range(start: int, length: int) -> bytes:
        data = store.read_range(name, start, length)
        if stats is not None:
            stats.add(len(data))
        return data

    return read_safetensors_header(read_range, size, file)


def _remote_header(file: str, snapshot: Snapshot | None, stats: ReadStats | None) -> SafetensorsHeader:
    if snapshot is not None and snapshot.store is not None and file in snapshot.files:
        return _object_header(file, snapshot.store, snapshot.files[file].size, stats)
    prefix, _, name = file.rpartition("/")  # not listed by this load: one client and a HEAD for it
    store = open_store(parse_object_uri(prefix))
    return _object_header(file, store, store.head(name).size, stats)


def read_headers(files: Sequence[str], snapshot: Snapshot | None,
                 stats: ReadStats | None = None) -> Iterator[SafetensorsHeader]:
    """The validated header of each of ``files`` (local paths, or object URIs the snapshot lists), in order; the
    objects' headers are fetched at once.

    :param stats: counts the header bytes fetched when they are what is being read (``loader inspect``);
        a load's statistics count tensor bytes, so its check passes none.

    :raises CheckpointFormatError: naming the file, for the first malformed header.
    """
    remote = [file for file in files if "://" in file]
    if len(remote) < 2:
        for file in files:
            yield _remote_header(file, snapshot, stats) if "://" in file else read_safetensors_file_header(file)
        return
    pool = ThreadPoolExecutor(max_workers=min(HEADER_READERS, len(remote)), thread_name_prefix="loader-headers")
    try:
        pending: dict[str, Future[SafetensorsHeader]] = {
            file: pool.submit(_remote_header, file, snapshot, stats) for file in dict.fromkeys(remote)}
        for file in files:  # in order, so the first malformed file of the list is the one named
            yield pending[file].result() if "://" in file else read_safetensors_file_header(file)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def iter_declared_tensors(
    files: Sequence[str], snapshot: Snapshot | None, stats: ReadStats
) -> Iterator[tuple[str, HeaderOnlyTensor]]:
    """``(name, HeaderOnlyTensor)`` for every tensor of ``files``, in file order, from their headers alone."""
    for header in read_headers(files, snapshot, stats):
        for info in header.tensors.values():
            yield info.name, HeaderOnlyTensor(info.name, header.path, info.dtype, info.shape)
