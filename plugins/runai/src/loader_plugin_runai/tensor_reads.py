"""How a streamed tensor reaches its destination, with as few copies as the destination allows.

- **into a parameter**: the destination is model memory on the CPU, contiguous, in
  the stored dtype (the usual bf16 load, fused parts at their offsets, this rank's
  rows under TP). It is the streamer's destination itself: the ranges are queued, sent
  to the streamer with others in submissions of about 64 MiB, and the weight loader
  moves on at once, so the streamer's readers work ahead of the loaders. Every such write has landed
  before the stream ends (:meth:`TensorReads.finish`), which is before ``load_weights``
  returns and anything reads a parameter.
- **from an object store, into a parameter**: the same ranges, placed back to back in
  a slot of the staging ring so the streamer joins neighbours into one request, and
  copied into the parameters when the slot arrives (:mod:`.slot_batches`; a request
  costs far more than a copy there);
- **into other CPU memory of the stored dtype** (a quantize method's scratch, a
  :meth:`~loader.weights.CheckpointTensor.read`): the same, but waited for at once,
  since the caller uses the values next.
- **through the staging ring** (:mod:`.staging`): a conversion, a GPU destination:
  fetched piecewise into the bounded ring, each piece copied out while the next is
  fetched. A strided destination is read whole first, then copied.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Any

from loader.errors import LoadError
from loader.weights import ReadStats

from .range_reads import RangeReads, StreamerFailure, Submission
from .slot_batches import SlotBatches
from .staging import StagingRing, single_threaded

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from .tensor import StreamedTensor

__all__ = ["TensorReads", "model_memory"]


def model_memory(model: Any) -> list[tuple[int, int]]:
    """The CPU address spans ``[start, end)`` of every parameter and buffer of ``model``, sorted."""
    spans = set()
    if model is not None:
        for tensor in (*model.parameters(), *model.buffers()):
            data = tensor.data
            if data.device.type == "cpu" and data.numel():
                start = data.untyped_storage().data_ptr()
                spans.add((start, start + data.untyped_storage().nbytes()))
    return sorted(spans)


class TensorReads:
    """One load's reads: the streamer session, the staging ring, the model's memory, the byte counter."""

    def __init__(self, stats: ReadStats, ring: StagingRing, model_spans: list[tuple[int, int]],
                 failed: Callable[[BaseException], LoadError]) -> None:
        self.stats = stats
        self.ring = ring
        self._spans = model_spans
        self._starts = [start for start, _ in model_spans]
        self._failed = failed
        self._session: RangeReads | None = None
        self._batches = SlotBatches(lambda: self.session, ring, lambda nbytes: self.stats.add(nbytes, 1))

    @property
    def session(self) -> RangeReads:
        if self._session is None:
            self._session = RangeReads()
        return self._session

    def _in_model(self, out: torch.Tensor) -> bool:
        start = out.data_ptr()
        end = start + out.numel() * out.element_size()
        index = bisect.bisect_right(self._starts, start) - 1
        return index >= 0 and end <= self._spans[index][1]

    def read_into(self, tensor: StreamedTensor, out: torch.Tensor) -> None:
        """Write ``tensor``'s values into ``out`` (shape checked by the caller)."""
        dest = out.detach()
        if dest.numel() == 0:
            self.stats.add(0, 1)
            return
        try:
            direct = dest.device.type == "cpu" and dest.dtype == tensor.dtype and dest.is_contiguous()
            into_model = direct and self._in_model(dest)
            remote = "://" in tensor.source.path
            if into_model and remote and self._batches.fits(tensor.nbytes):
                self._batches.add(tensor.source.path, tensor.ranges(), dest)
            elif direct:
                self._direct(tensor, dest, wait=not into_model)
            elif dest.is_contiguous():
                self._batches.drain()  # the ring's slots are free again before a piecewise read takes them
                self._staged(tensor, dest)
            else:
                values = self.read(tensor, dest.dtype if dest.device.type == "cpu" else None)
                with single_threaded():
                    dest.copy_(values)
        except StreamerFailure as exc:
            raise self._failed(exc) from exc

    def read(self, tensor: StreamedTensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """``tensor``'s values in new CPU memory (converted to ``dtype``)."""
        import torch

        out = torch.empty(tensor.shape, dtype=dtype or tensor.dtype)
        self.read_into(tensor, out)
        return out

    def _direct(self, tensor: StreamedTensor, dest: torch.Tensor, *, wait: bool) -> None:
        ranges = tensor.ranges()
        submission = self.session.submit(tensor.source.path, ranges, dest.data_ptr(), keep=dest,
                                         done=lambda: self.stats.add(ranges.nbytes, 1), batched=not wait)
        if wait:
            self.session.wait(submission)

    def _staged(self, tensor: StreamedTensor, dest: torch.Tensor) -> None:
        """Fetch into the ring piece by piece, copying each piece out while the next is fetched."""
        flat = dest.view(-1)
        itemsize = tensor.source.info.dtype.itemsize
        stored = tensor.dtype
        previous: tuple[Submission, torch.Tensor, int, int] | None = None
        element = 0
        for piece in tensor.ranges().split(self.ring.slot_bytes, itemsize):
            slot = self.ring.take()
            submission = self.session.submit(tensor.source.path, piece, slot.data_ptr(), keep=slot)
            count = piece.nbytes // itemsize
            if previous is not None:
                self._copy_out(previous, flat, stored, itemsize)
            previous = (submission, slot, element, count)
            element += count
        if previous is not None:
            self._copy_out(previous, flat, stored, itemsize)
        self.stats.add(0, 1)

    def _copy_out(self, piece: tuple[Submission, torch.Tensor, int, int], flat: torch.Tensor,
                  stored: torch.dtype, itemsize: int) -> None:
        submission, slot, element, count = piece
        self.session.wait(submission)
        self.stats.add(submission.nbytes)
        with single_threaded():
            flat[element:element + count].copy_(slot[:count * itemsize].view(stored))

    def finish(self) -> None:
        """Wait until every write submitted has landed; raise the load's error if one failed."""
        if self._session is None:
            return
        try:
            self._batches.drain()
            self._session.wait()
        except StreamerFailure as exc:
            raise self._failed(exc) from exc

    def close(self) -> None:
        """End the streamer session (joins its workers; safe to call twice)."""
        session, self._session = self._session, None
        if session is not None:
            session.close()
