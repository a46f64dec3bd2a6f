"""The weight iterator: every tensor of a list of safetensors files, through the Run:ai streamer.

One ``stream_files`` call covers all the files, so the streamer's readers
(threads locally, S3 clients remotely) work across file boundaries; tensors
arrive in whatever order their reads finish. Each is yielded as a
:class:`~loader_plugin_runai.tensor.StreamedTensor` and released (copied out
or dropped, see :mod:`.tensor`) before the streamer is asked for the next,
since its buffer is then reused. Every fetched byte is added to the load's
``ReadStats``. Every header is first checked by the core's safetensors parser
(:mod:`.headers`), so a malformed file is refused as the local reader refuses
it, before anything is streamed. Once the stream ends, the files' identities are checked
against the listing (:mod:`.identity`); a streamer failure becomes a
:class:`~loader.errors.LoadError` naming the source and, when a file changed
under the load, which one.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Sequence

from loader.errors import CheckpointFormatError, LoadError, UnsupportedError
from loader.weights import ReadStats

from .errors import ObjectChangedError, StorageAccessError
from .headers import read_headers
from .identity import Snapshot
from .settings import StreamerSettings
from .tensor import StreamedTensor, StreamSlot

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
    from runai_model_streamer.file_streamer.requests_iterator import RunaiStreamerMemoryLimitException

    if isinstance(exc, RunaiStreamerMemoryLimitException):
        return UnsupportedError(
            f"{where}: format option 'memory_limit' is too small for this checkpoint: {exc} "
            "(use at least its largest tensor, 0 for one tensor at a time, or -1 for no limit)"
        )
    changed = _changed(snapshot)
    if changed is not None:
        return changed
    reason = " ".join(str(exc).split()) or type(exc).__name__
    if remote:
        return StorageAccessError(f"{where}: streaming from object storage failed: {reason}")
    return CheckpointFormatError(f"{where}: the Run:ai streamer could not read the files: {reason}")


def _owners(streamer: object, files: Sequence[str]) -> dict[str, str]:
    """Tensor name -> file, from the headers the streamer read (for messages)."""
    owners: dict[str, str] = {}
    table = getattr(streamer, "files_to_tensors_metadata", {})
    for index, metas in table.items():
        for meta in metas:
            owners[str(meta.name)] = files[index]
    return owners


def iter_streamed_weights(
    files: Sequence[str], settings: StreamerSettings, stats: ReadStats, *, where: str,
    snapshot: Snapshot | None = None,
) -> Iterator[tuple[str, StreamedTensor]]:
    """Yield ``(name, StreamedTensor)`` for every tensor of ``files``, fetching each byte once.

    :param files: local paths or ``s3://`` URIs (one kind per call, as the streamer requires).
    :param settings: concurrency, memory limit and chunk size for this stream.
    :param stats: where fetched bytes are counted.
    :param where: how messages name the source.
    :param snapshot: the files' identities when listed, checked again at the end.
    """
    from runai_model_streamer import SafetensorsStreamer

    remote = any("://" in f for f in files)
    try:
        for _ in read_headers(files, snapshot):  # the format's rules, before the streamer reads a byte
            pass
    except LoadError as exc:
        changed = _changed(snapshot)  # a file replaced or cut since it was listed says so, not its torn header
        if changed is None:
            raise
        raise changed from exc
    with settings.applied(), SafetensorsStreamer() as streamer:
        try:
            streamer.stream_files(list(files), device="cpu", owned=False)
        except Exception as exc:
            raise _failure(where, remote, snapshot, exc) from exc
        owners = _owners(streamer, files)
        tensors = streamer.get_tensors()
        last: weakref.ref[StreamSlot] | None = None
        try:
            while True:
                try:
                    name, values = next(tensors)
                except StopIteration:
                    break
                except Exception as exc:
                    raise _failure(where, remote, snapshot, exc) from exc
                stats.add(values.numel() * values.element_size(), 1)
                slot = StreamSlot(values, name, owners.get(name, where))
                del values
                last = weakref.ref(slot)
                yield name, StreamedTensor(slot)
                del slot
                held = last()
                if held is not None:
                    held.release()
        finally:
            held = last() if last is not None else None
            if held is not None:
                held.release()
            tensors.close()
    if snapshot is not None:
        snapshot.verify()
