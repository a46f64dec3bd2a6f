"""Reusable staging buffers for reads that cannot land in their destination directly.

A read that converts dtype, fills a non-contiguous view or targets a GPU goes
through a host buffer one chunk at a time. Allocating (and, for pinned memory,
registering) a fresh buffer per tensor would cost more than the copy, so each
thread keeps a couple of buffers per kind and grows them on demand; buffers
above :data:`KEEP_MAX_BYTES` are handed out once and not kept.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["KEEP_MAX_BYTES", "release_staging_buffers", "staging_buffer"]

KEEP_MAX_BYTES = 128 << 20
"""Buffers up to this size are kept for reuse by the thread that allocated them."""

_local = threading.local()


def staging_buffer(slot: int, nbytes: int, *, pinned: bool = False) -> torch.Tensor:
    """A ``uint8`` CPU tensor of exactly ``nbytes`` for this thread's ``slot`` (page-locked if ``pinned``).

    The same slot returns the same memory until a larger request replaces it, so a
    caller that double-buffers uses two slots and never hands out one twice at once.
    """
    cache: dict[tuple[int, bool], torch.Tensor] | None = getattr(_local, "buffers", None)
    if cache is None:
        cache = {}
        _local.buffers = cache
    key = (slot, pinned)
    held = cache.get(key)
    if held is not None and held.numel() >= nbytes:
        return held[:nbytes]
    fresh = torch.empty(max(nbytes, 1), dtype=torch.uint8, pin_memory=pinned)
    if nbytes <= KEEP_MAX_BYTES:
        cache[key] = fresh
    else:
        cache.pop(key, None)
    return fresh[:nbytes]


def release_staging_buffers() -> None:
    """Drop this thread's kept buffers (after a load, to give the memory back)."""
    _local.buffers = {}
