"""The weight iterator: every tensor of a list of safetensors files, read through the Run:ai streamer.

Every header is first checked by the core's safetensors parser (:mod:`.headers`),
so a malformed file is refused as the local reader refuses it, before a byte of
tensor data moves. Then each tensor is yielded as an unread
:class:`~loader_plugin_runai.tensor.StreamedTensor`, in file order: the weight
loaders narrow it to this rank's shard, and the streamer writes exactly those
bytes into the parameter (:mod:`.tensor_reads`). The stream ends once every such
write has landed, then the files' identities are checked against the listing
(:mod:`.identity`). A streamer failure becomes a :class:`~loader.errors.LoadError`
naming the source and, when a file changed under the load, which one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from loader.errors import CheckpointFormatError, LoadError
from loader.weights import ReadStats

from .errors import ObjectChangedError, StorageAccessError
from .headers import read_headers
from .identity import Snapshot
from .range_reads import claim_backend
from .settings import StreamerSettings
from .staging import StagingRing
from .tensor import StreamedSource, StreamedTensor
from .tensor_reads import TensorReads, model_memory

__all__ = ["iter_streamed_weights"]


def _changed(snapshot: Snapshot | None) -> ObjectChangedError | None:
    """The error naming a file that changed since it was listed, if one did (and the store can say)."""
    if snapshot is None:
        return None
    try:
        snapshot.verify()
    except ObjectChangedError as changed:
        return changed
    except LoadError:
        pass  # the store cannot answer either (a server gone): the first reason says more
    return None


def _failure(where: str, remote: bool, snapshot: Snapshot | None, exc: BaseException) -> LoadError:
    """The error for a streamer failure: a changed file if one changed, else the streamer's reason."""
    if isinstance(exc, LoadError):
        return exc
    changed = _changed(snapshot)
    if changed is not None:
        return changed
    reason = " ".join(str(exc).split()) or type(exc).__name__
    if remote:
        return StorageAccessError(f"{where}: streaming from object storage failed: {reason}")
    return CheckpointFormatError(f"{where}: the Run:ai streamer could not read the files: {reason}")


def iter_streamed_weights(
    files: Sequence[str], settings: StreamerSettings, stats: ReadStats, *, where: str,
    snapshot: Snapshot | None = None, model: Any = None,
) -> Iterator[tuple[str, StreamedTensor]]:
    """Yield ``(name, StreamedTensor)`` for every tensor of ``files``; each read fetches only its bytes.

    :param files: local paths or object URIs (one kind per call, as the streamer requires).
    :param settings: concurrency, staging ring size and chunk size for this stream.
    :param stats: where fetched bytes are counted.
    :param where: how messages name the source.
    :param snapshot: the files' identities when listed, checked again at the end.
    :param model: the model being loaded: reads into its memory are not waited for one by one.
    """
    remote = any("://" in f for f in files)
    try:
        headers = list(read_headers(files, snapshot))  # the format's rules, before the streamer reads a byte
    except LoadError as exc:
        changed = _changed(snapshot)  # a file replaced or cut since it was listed says so, not its torn header
        if changed is None:
            raise
        raise changed from exc
    if remote:  # after the headers, which the store's own client reads
        claim_backend(files[0].partition("://")[0], where)
    sizes = [info.nbytes for header in headers for info in header.tensors.values()]
    ring = StagingRing(settings.ring_bytes(sizes, remote))
    reads = TensorReads(stats, ring, model_memory(model),
                        lambda exc: _failure(where, remote, snapshot, exc))
    with settings.applied():
        try:
            for file, header in zip(files, headers, strict=True):
                for name, info in sorted(header.tensors.items(), key=lambda item: item[1].begin):
                    yield name, StreamedTensor(StreamedSource(file, info, reads))
            reads.finish()
        finally:
            reads.close()
    if snapshot is not None:
        snapshot.verify()
