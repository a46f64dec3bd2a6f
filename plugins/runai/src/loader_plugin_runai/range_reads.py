"""The streamer's request API: byte ranges of files, each written by the streamer to an address we give.

``SafetensorsStreamer`` reads into a ring of its own buffers and hands out views
that the caller must copy out before the ring is reused: a second pass over every
byte, into memory the ring already paid to fault in. The library under it takes
a destination per range (``runai_request``: files, ranges, one absolute address per
range) and its workers — threads on local files, object-store clients remotely —
write there directly. :class:`RangeReads` is one such session: a submission per
tensor (a submission is divided across every worker by the library, so one large
tensor is still read by all of them), completions collected as they come.

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

from .ranges import ByteRanges

__all__ = ["RangeReads", "StreamerFailure", "Submission"]


class StreamerFailure(Exception):
    """The library answered a range with an error (its own words in the message)."""


@attrs.define(eq=False)
class Submission:
    """One request in flight: how many ranges are still owed, what keeps its destinations alive, what it counts."""

    remaining: int
    nbytes: int
    keep: Any = attrs.field(repr=False)
    done: Callable[[], None] | None = None


class RangeReads:
    """A session of the streamer's library: submit ranges with destinations, wait for them, end once."""

    def __init__(self) -> None:
        from runai_model_streamer.file_streamer.file_streamer import FileStreamer

        # FileStreamer owns the library handle and applies object-store credentials the way the streamer
        # does for its own streams (boto3's resolution for s3://, the backends' own chains otherwise).
        self._owner = FileStreamer()
        self._owner.__enter__()
        self._live: dict[int, Submission] = {}
        self._credentialed: set[str] = set()

    @property
    def outstanding(self) -> int:
        """Ranges submitted and not answered yet."""
        return sum(s.remaining for s in self._live.values())

    def submit(self, path: str, ranges: ByteRanges, address: int, keep: Any,
               done: Callable[[], None] | None = None) -> Submission:
        """Ask for ``ranges`` of ``path``, written back to back from ``address``; returns at once.

        :param keep: what owns the destination memory, held until the ranges are answered.
        :param done: called (on the consuming thread) once every range of the submission has arrived.
        """
        from runai_model_streamer.libstreamer.libstreamer import runai_request

        scheme = path.partition("://")[0] if "://" in path else ""
        if scheme and scheme not in self._credentialed:
            self._owner.handle_object_store(path, self._owner.streamer)
            self._credentialed.add(scheme)
        destinations, cursor = [], address
        for size in ranges.sizes:
            destinations.append(cursor)
            cursor += size
        submission = Submission(len(ranges.sizes), ranges.nbytes, keep, done)
        ident = runai_request(self._owner.streamer, [path], [len(ranges.sizes)], list(ranges.offsets),
                              list(ranges.sizes), destinations)
        self._live[ident] = submission
        return submission

    def wait(self, submission: Submission | None = None) -> None:
        """Collect answers until ``submission`` (or, given none, every submission) has all its ranges.

        :raises StreamerFailure: on the first range the library answers with an error.
        """
        from runai_model_streamer.libstreamer.libstreamer import SUCCESS_ERROR_CODE, runai_response, runai_response_str

        def pending() -> bool:
            return submission.remaining > 0 if submission is not None else bool(self._live)

        while pending():
            answer = runai_response(self._owner.streamer)
            if answer is None:
                raise StreamerFailure("the streamer shut down before every range arrived")
            code, ident, _, _, _ = answer
            owner = self._live.get(ident)
            if owner is None:
                raise StreamerFailure(f"an answer for submission {ident}, which this session never made")
            if code != SUCCESS_ERROR_CODE:
                raise StreamerFailure(str(runai_response_str(code), "utf-8", "replace"))
            owner.remaining -= 1
            if owner.remaining == 0:
                del self._live[ident]
                if owner.done is not None:
                    owner.done()

    def close(self) -> None:
        """End the session; the library joins its workers, after which nothing can write to a destination."""
        owner, self._owner = self._owner, None  # type: ignore[assignment]
        if owner is not None:
            owner.__exit__(None, None, None)
        self._live.clear()  # only now may what is still in flight be freed
