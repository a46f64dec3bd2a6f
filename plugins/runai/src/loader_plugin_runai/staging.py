"""The bounded staging ring: where bytes land when they cannot land in their destination.

Most reads need no staging: a CPU parameter of the stored dtype is the streamer's
destination itself. The rest — a conversion (bf16 on disk into float32
parameters), a GPU destination, a strided view — are fetched into this ring in
pieces and converted or copied from there. The ring is two slots of half the
``memory_limit`` each, allocated on first use and reused for the whole load, so
the streamer fills one slot while the other is copied out: memory held is the
limit, never the checkpoint. Its default is the checkpoint's largest tensor
(:func:`default_limit`), so one such tensor is two requests.

The copy out of a slot runs while the streamer's readers fill the next one. Torch
would split each copy over all its intra-op threads, which then compete with those
readers for the same cores; copies here run with one thread (:func:`single_threaded`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["MIN_LIMIT", "REMOTE_MIN_LIMIT", "StagingRing", "default_limit", "single_threaded"]

MIN_LIMIT = 1 << 20
"""The smallest ring accepted (``memory_limit``): two 512 KiB slots."""

REMOTE_MIN_LIMIT = 128 << 20
"""The default ring from an object store is at least this: slots of 64 MiB gather many tensors per request
(:mod:`.slot_batches`)."""


def default_limit(tensor_bytes: Sequence[int], remote: bool = False) -> int:
    """The ring when ``memory_limit`` is unset: the largest tensor (at least :data:`MIN_LIMIT`; from an object
    store at least :data:`REMOTE_MIN_LIMIT`)."""
    return max(REMOTE_MIN_LIMIT if remote else MIN_LIMIT, max(tensor_bytes, default=0))


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """Torch ops in the block use one intra-op thread (then the count is restored): the cores belong to the
    streamer's readers while a load streams."""
    import torch

    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class StagingRing:
    """Two reused byte buffers of ``limit // 2`` each, allocated when first needed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.slot_bytes = max(1, limit // 2)
        self._slots: list[torch.Tensor] = []
        self._next = 0

    @property
    def allocated_bytes(self) -> int:
        """Bytes the ring holds now (0 until a read needed it; at most :attr:`limit`)."""
        return sum(slot.numel() for slot in self._slots)

    def take(self) -> torch.Tensor:
        """The next slot, alternating, as ``uint8``; the caller must be done with the one taken two calls ago."""
        import torch

        if not self._slots:
            self._slots = [torch.empty(self.slot_bytes, dtype=torch.uint8) for _ in range(2)]
        slot = self._slots[self._next]
        self._next ^= 1
        return slot
