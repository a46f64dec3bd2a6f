"""Ask the kernel to back large destination tensors with transparent huge pages.

Freshly allocated memory (a new tensor, or parameters just materialised from
the meta device) is faulted in page by page on first write. Where a 4 KiB
fault is costly (a VM's host backing memory on first touch), writing fresh
memory is several times slower than copying into touched memory; with THP in
``madvise`` mode (the common default) one ``madvise(MADV_HUGEPAGE)`` on the
2 MiB-aligned interior of the buffer makes the faults 512x rarer and such reads
faster (benchmarks/RESULTS.md) — except in a VM whose balloon reports free pages
to its host, where huge-page faults re-fault the host and 4 KiB ones are faster
(:func:`loader.io.advise_fresh_huge_pages` decides). It is only a hint: contents and semantics do not change,
and where it is unsupported it does nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from typing import TYPE_CHECKING, Any

from loader.io import advise_fresh_huge_pages

if TYPE_CHECKING:
    import torch

__all__ = ["HUGE_PAGE_BYTES", "MIN_HINT_BYTES", "advise_huge_pages"]

HUGE_PAGE_BYTES = 2 << 20
MIN_HINT_BYTES = 4 << 20
"""Smaller buffers have no whole huge page worth advising."""

_MADV_HUGEPAGE = getattr(mmap, "MADV_HUGEPAGE", None)


def _load_madvise() -> Any:
    if not sys.platform.startswith("linux") or _MADV_HUGEPAGE is None:
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Hint THP for a contiguous CPU tensor's memory; ``True`` if the kernel accepted the hint. No hint where
    :func:`loader.io.advise_fresh_huge_pages` says 4 KiB faults are faster on this machine."""
    if _madvise is None or tensor.device.type != "cpu" or not tensor.is_contiguous():
        return False
    if not advise_fresh_huge_pages():
        return False
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes < MIN_HINT_BYTES:
        return False
    start = tensor.data_ptr()
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    last = (start + nbytes) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if last <= first:
        return False
    return bool(_madvise(first, last - first, _MADV_HUGEPAGE) == 0)
