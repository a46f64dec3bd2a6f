"""The streamer's request API: byte ranges of files, each written by the streamer to an address we give.

``SafetensorsStreamer`` reads into a ring of its own buffers and hands out views
that the caller must copy out before the ring is reused: a second pass over every
byte, into memory the ring already paid to fault in. The library under it takes
a destination per range (``runai_request``: files, ranges, one absolute address per
range) and its workers — threads on local files, object-store clients remotely —
write there directly. :class:`RangeReads` is one such session: the ranges of
many tensors go in one submission (the library divides a submission across all
its workers), completions are collected as they come, per tensor.

Memory rules the library states: a destination must stay alive until the session
ends unless the library has answered for every range written to it (a completion,
successful or a storage error). So every submission keeps its destinations until it
completes, and a session that fails keeps whatever is still in flight until
``runai_end`` has joined the workers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from loader.errors import UnsupportedError

from .ranges import ByteRanges

__all__ = ["RangeReads", "StreamerFailure", "Submission", "claim_backend"]

_backend: list[str] = []
"""The object-store scheme this process streamed from first (the library keeps that backend for good)."""


def claim_backend(scheme: str, where: str) -> None:
    """Refuse a second object-store scheme in one process, before anything is read.

    The library loads the backend of the first object store it reads and keeps it for the
    process: a later request for another scheme goes to that backend and fails (an ``s3://``
    process asked for ``gs://`` bytes gets S3's error page written into the destination).
    """
    if not _backend:
        _backend.append(scheme)
    elif _backend[0] != scheme:
        raise UnsupportedError(
            f"{where}: this process already streamed from {_backend[0]}://, and the Run:ai streamer keeps the first "
            f"object-store backend it loads for the whole process; load {scheme}:// checkpoints in another process"
        )


class StreamerFailure(Exception):
    """The library answered a range with an error (its own words in the message)."""


BATCH_BYTES = 64 << 20
"""Writes that need not be waited for are sent in submissions of about this many bytes: an object-store
submission costs tens of milliseconds of the library's own before its first byte moves (64 one-tensor
submissions of 1 KiB took 3.1 s against moto, 16 took 0.7 s), while the ranges of one submission are fetched
in parallel by every worker."""


@attrs.define(eq=False)
class Submission:
    """One tensor's ranges: how many are still owed, what keeps the destination alive, what to call when done."""

    remaining: int
    nbytes: int
    keep: Any = attrs.field(repr=False)
    done: Callable[[], None] | None = None
    sent: bool = False


@attrs.define(eq=False)
class _Batch:
    """What one ``runai_request`` carries: per file, its ranges, their destinations and the tensor each serves."""

    paths: list[str] = attrs.field(factory=list)
    counts: list[int] = attrs.field(factory=list)
    offsets: list[int] = attrs.field(factory=list)
    sizes: list[int] = attrs.field(factory=list)
    destinations: list[int] = attrs.field(factory=list)
    owners: list[Submission] = attrs.field(factory=list)
    starts: list[int] = attrs.field(factory=list)
    """The flat index of each file's first range."""
    nbytes: int = 0

    def add(self, path: str, ranges: ByteRanges, address: int, owner: Submission) -> None:
        if not self.paths or self.paths[-1] != path:
            self.paths.append(path)
            self.counts.append(0)
            self.starts.append(len(self.sizes))
        self.counts[-1] += len(ranges.sizes)
        cursor = address
        for offset, size in zip(ranges.offsets, ranges.sizes, strict=True):
            self.offsets.append(offset)
            self.sizes.append(size)
            self.destinations.append(cursor)
            self.owners.append(owner)
            cursor += size
        self.nbytes += ranges.nbytes


class RangeReads:
    """A session of the streamer's library: queue or submit ranges with destinations, wait for them, end once."""

    def __init__(self) -> None:
        from runai_model_streamer.file_streamer.file_streamer import FileStreamer

        # FileStreamer owns the library handle and applies object-store credentials the way the streamer
        # does for its own streams (boto3's resolution for s3://, the backends' own chains otherwise).
        self._owner = FileStreamer()
        self._owner.__enter__()
        self._live: dict[int, _Batch] = {}
        self._answered: dict[int, int] = {}
        self._queued = _Batch()
        self._credentialed: set[str] = set()

    def submit(self, path: str, ranges: ByteRanges, address: int, keep: Any,
               done: Callable[[], None] | None = None, *, batched: bool = False) -> Submission:
        """Ask for ``ranges`` of ``path``, written back to back from ``address``; returns at once.

        :param keep: what owns the destination memory, held until the ranges are answered.
        :param done: called (on the consuming thread) once every range has arrived.
        :param batched: queue the ranges with others, sent once about :data:`BATCH_BYTES` are queued (or on
            :meth:`wait`); otherwise they are sent now, in a submission of their own.
        """
        owner = Submission(len(ranges.sizes), ranges.nbytes, keep, done)
        self._queued.add(path, ranges, address, owner)
        if not batched or self._queued.nbytes >= BATCH_BYTES:
            self.flush()
        return owner

    def flush(self) -> None:
        """Send what is queued, in one submission."""
        from runai_model_streamer.libstreamer.libstreamer import runai_request

        batch, self._queued = self._queued, _Batch()
        if not batch.sizes:
            return
        for path in batch.paths:
            scheme = path.partition("://")[0] if "://" in path else ""
            if scheme and scheme not in self._credentialed:
                self._owner.handle_object_store(path, self._owner.streamer)
                self._credentialed.add(scheme)
        for owner in batch.owners:
            owner.sent = True
        ident = runai_request(self._owner.streamer, batch.paths, batch.counts, batch.offsets, batch.sizes,
                              batch.destinations)
        self._live[ident] = batch
        self._answered[ident] = 0

    def wait(self, submission: Submission | None = None) -> None:
        """Collect answers until ``submission`` (or, given none, everything queued or sent) has all its ranges.

        :raises StreamerFailure: on the first range the library answers with an error.
        """
        if submission is None or not submission.sent:
            self.flush()
        while (submission.remaining > 0) if submission is not None else bool(self._live):
            self._answer_one()

    def _answer_one(self) -> None:
        from runai_model_streamer.libstreamer.libstreamer import SUCCESS_ERROR_CODE, runai_response, runai_response_str

        answer = runai_response(self._owner.streamer)
        if answer is None:
            raise StreamerFailure("the streamer shut down before every range arrived")
        code, ident, file_index, range_index, _ = answer
        batch = self._live.get(ident)
        if batch is None:
            raise StreamerFailure(f"an answer for submission {ident}, which this session never made")
        if code != SUCCESS_ERROR_CODE:
            raise StreamerFailure(str(runai_response_str(code), "utf-8", "replace"))
        owner = batch.owners[batch.starts[file_index] + range_index]
        owner.remaining -= 1
        if owner.remaining == 0 and owner.done is not None:
            owner.done()
        self._answered[ident] += 1
        if self._answered[ident] == len(batch.sizes):
            del self._live[ident], self._answered[ident]

    def close(self) -> None:
        """End the session; the library joins its workers, after which nothing can write to a destination."""
        owner, self._owner = self._owner, None  # type: ignore[assignment]
        if owner is not None:
            owner.__exit__(None, None, None)
        self._live.clear()  # only now may what is still in flight be freed
        self._queued = _Batch()
