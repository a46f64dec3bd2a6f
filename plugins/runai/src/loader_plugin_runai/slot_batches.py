"""Object-store reads gathered into the staging ring's slots, so that neighbouring tensors are one request.

The streamer's object-store backends send one GET per range (or per chunk of a large
one) unless ranges that follow each other in the object also follow each other in
memory: then it joins them. Tensors written straight into their parameters are never
adjacent in memory (each parameter has memory of its own), so a checkpoint of a few
hundred tensors became a few hundred GETs, several times slower than downloading the
objects with boto3 (benchmarks/RESULTS.md). Over the network a memory copy costs
little beside a request, so for ``s3://``, ``gs://`` and ``az://`` the ranges a load
does not wait for are placed back to back in a slot of the staging ring, the slot is
sent as one submission when full, and each tensor is copied from the slot into its
parameter once the slot has arrived, while the streamer fills the other slot.
Only this rank's ranges are placed, so a tensor-parallel rank still fetches its
own bytes only (its ranges of neighbouring tensors are not adjacent in the object,
so they stay separate requests).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from .range_reads import RangeReads, Submission
from .staging import StagingRing, single_threaded

if TYPE_CHECKING:
    import torch

    from .ranges import ByteRanges

__all__ = ["SlotBatches"]


@attrs.define(eq=False)
class _Filled:
    """A slot in flight: where each tensor's bytes lie in it, and where they go."""

    slot: torch.Tensor
    items: list[tuple[Submission, int, torch.Tensor]] = attrs.field(factory=list)
    used: int = 0


class SlotBatches:
    """Ranges queued into the ring's two slots, sent a slot at a time, copied out when the slot arrives."""

    def __init__(self, session: Callable[[], RangeReads], ring: StagingRing,
                 counted: Callable[[int], None]) -> None:
        self._session = session
        self._ring = ring
        self._counted = counted
        self._open: _Filled | None = None
        self._sent: deque[_Filled] = deque()

    def fits(self, nbytes: int) -> bool:
        """Whether a tensor of ``nbytes`` can go through a slot (a larger one is read piecewise instead)."""
        return nbytes <= self._ring.slot_bytes

    def add(self, path: str, ranges: ByteRanges, dest: torch.Tensor) -> None:
        """Queue ``ranges`` of ``path`` for ``dest`` (contiguous, CPU, the stored dtype)."""
        if self._open is not None and self._open.used + ranges.nbytes > self._ring.slot_bytes:
            self._send()
        if self._open is None:
            if len(self._sent) == 2:
                self._complete(self._sent.popleft())
            self._open = _Filled(self._ring.take())
        filled = self._open
        address = filled.slot.data_ptr() + filled.used
        owner = self._session().submit(path, ranges, address, keep=filled.slot, batched=True)
        filled.items.append((owner, filled.used, dest))
        filled.used += ranges.nbytes

    def _send(self) -> None:
        if self._open is not None:
            self._session().flush()
            self._sent.append(self._open)
            self._open = None

    def _complete(self, filled: _Filled) -> None:
        """Wait for a slot's ranges, then copy each tensor out of it into its destination."""
        session = self._session()
        with single_threaded():
            for owner, start, dest in filled.items:
                session.wait(owner)
                _copy_bytes(filled.slot, start, dest)
                self._counted(owner.nbytes)

    def drain(self) -> None:
        """Send the open slot and complete every slot in flight (before the ring is used otherwise, and at the end)."""
        self._send()
        while self._sent:
            self._complete(self._sent.popleft())


def _copy_bytes(slot: torch.Tensor, start: int, dest: torch.Tensor) -> None:
    """``dest``'s bytes from ``slot[start:]`` (both contiguous, on the CPU)."""
    import torch

    nbytes = dest.numel() * dest.element_size()
    dest.view(-1).view(torch.uint8).copy_(slot[start:start + nbytes])
