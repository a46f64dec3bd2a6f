"""Memory for the buffers a load builds on the CPU: huge-page chunks, carved by a bump allocator.

Why: a packed load writes tens of MB into fresh memory (torch's int4 layout,
its scales, the int8 planes), a few hundred KB a layer. Each ``torch.empty``
of that size is its own ``mmap`` and every 4 KiB page of it faults once on
first write: on SmolLM2 Q4_1 that was ~30 ms of a 0.16 s load. Carved from
32 MiB chunks advised for transparent huge pages, the same bytes fault once
per 2 MiB (``benchmarks/RESULTS.md``).

Scope: :func:`load_arena` is active while the core post-processes a CPU load
(``loader._pipeline.load``); :func:`arena_empty` takes from it then, and is
plain ``torch.empty`` anywhere else (a method called outside a load, another
device). An arena gives memory back when every tensor carved from a chunk is
gone — a buffer replaced later keeps its chunk alive as long as a neighbour
does, as the parameters' arena does (:mod:`loader._pipeline.materialize`).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import mmap
import threading
from collections.abc import Iterator, Sequence

import torch

__all__ = ["CHUNK_BYTES", "HUGE_PAGE", "LoadArena", "arena_empty", "huge_page_buffer", "load_arena"]

HUGE_PAGE = 2 * 1024 * 1024
CHUNK_BYTES = 32 * 1024 * 1024
"""Bytes a chunk reserves (virtual memory: only the huge pages written to become resident)."""
_ALIGN = 64


def huge_page_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of private anonymous memory (uint8), 2 MiB aligned, its whole 2 MiB spans advised for
    transparent huge pages and the tail advised against.

    Private, because the kernel ignores huge-page advice on shared memory where
    ``shmem_enabled`` is ``never`` (``mmap.mmap(-1, n)`` alone is ``MAP_SHARED``);
    aligned, so every 2 MiB can be one page. Only the spans filled are advised:
    a huge page faulted in for a few small tensors would add a whole 2 MiB of
    zeroes to the resident set.
    """
    size = max(nbytes, 1) + HUGE_PAGE
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
    buffer = mmap.mmap(-1, size, flags=flags) if flags else mmap.mmap(-1, size)
    whole = torch.frombuffer(buffer, dtype=torch.uint8)  # keeps ``buffer`` alive
    skip = -whole.data_ptr() % HUGE_PAGE
    advised = nbytes // HUGE_PAGE * HUGE_PAGE
    with contextlib.suppress(OSError):  # kernels without THP
        if advised and hasattr(mmap, "MADV_HUGEPAGE"):
            buffer.madvise(mmap.MADV_HUGEPAGE, skip, advised)
        if hasattr(mmap, "MADV_NOHUGEPAGE") and size - skip - advised > 0:
            buffer.madvise(mmap.MADV_NOHUGEPAGE, skip + advised, size - skip - advised)
    return whole[skip:skip + max(nbytes, 1)]


class LoadArena:
    """A bump allocator over :func:`huge_page_buffer` chunks of :data:`CHUNK_BYTES` (larger requests get a
    buffer of their own); every tensor starts on a 64-byte boundary."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0
        self._lock = threading.Lock()
        self.carved_bytes = 0

    def empty(self, shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised contiguous CPU tensor of ``shape`` and ``dtype`` from this arena."""
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if nbytes * 2 > self.chunk_bytes:
            raw = huge_page_buffer(nbytes)
        else:
            with self._lock:
                if self._chunk is None or self._used + nbytes > self._chunk.numel():
                    self._chunk, self._used = huge_page_buffer(self.chunk_bytes), 0
                raw = self._chunk[self._used:self._used + nbytes]
                self._used += -(-nbytes // _ALIGN) * _ALIGN
        self.carved_bytes += nbytes
        return raw.view(dtype).view(*shape) if nbytes else torch.empty(*shape, dtype=dtype)

    def close(self) -> None:
        """Stop carving: the arena's last chunk lives on only through the tensors carved from it."""
        with self._lock:
            self._chunk = None


_ACTIVE: contextvars.ContextVar[LoadArena | None] = contextvars.ContextVar("loader_load_arena", default=None)


@contextlib.contextmanager
def load_arena(device: torch.device | str = "cpu") -> Iterator[LoadArena | None]:
    """Make :func:`arena_empty` carve from one :class:`LoadArena` inside the block (CPU loads only)."""
    if torch.device(device).type != "cpu":
        yield None
        return
    arena = LoadArena()
    token = _ACTIVE.set(arena)
    try:
        yield arena
    finally:
        _ACTIVE.reset(token)
        arena.close()


def arena_empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """``torch.empty(shape, dtype=dtype, device=device)``, carved from the active :func:`load_arena` on the CPU."""
    arena = _ACTIVE.get()
    if arena is None or torch.device(device).type != "cpu":
        return torch.empty(*shape, dtype=dtype, device=device)
    return arena.empty(shape, dtype)
