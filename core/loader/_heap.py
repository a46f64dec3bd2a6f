"""Give the allocator's freed heap back to the OS once a load is done; keep it for per-call temporaries after.

Post-processing builds many short-lived tensors (GGUF blocks decoded into codes,
scales and biases before packing, one layer at a time). glibc keeps what they
freed in its heap for reuse, so a process's RSS after a packed GGUF load
stood well above its parameters with nothing live there. One
``malloc_trim(0)`` after the load returns those pages; elsewhere (musl, macOS)
there is nothing to call and nothing is done.

:func:`settle_malloc_thresholds` does the opposite for what runs after the load. glibc serves a block over its
mmap threshold (128 KiB at start) from a fresh mapping and unmaps it when freed, and trims the heap top once more
than twice that is free; each free of a mapped block raises the threshold to its size (up to 32 MiB). Until a
process has freed a block of a few tens of MiB, a layer that dequantizes its weight on every call (the
``dequantize`` kernel path) takes all of its temporaries from fresh pages: 8-14 thousand page faults a call for a
2048 x 2048 int8 weight, twice the time of the same call without them, and far more on a VM whose host reclaims
freed pages. Whether that happens depends on what the process freed before, so the kernel-path timings
(:mod:`loader.kernels.kernel_timing`) would measure one state and the forward run in another.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

__all__ = ["MALLOC_SETTLE_BYTES", "release_freed_heap", "settle_malloc_thresholds"]

MALLOC_SETTLE_BYTES = 31 << 20
"""The block freed once: just under glibc's 32 MiB ceiling, so its thresholds rise to their highest."""


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


@functools.cache
def _libc_malloc() -> tuple[ctypes._CFuncPtr, ctypes._CFuncPtr] | None:  # type: ignore[name-defined]
    if _malloc_trim() is None:  # not glibc (or not Linux): its thresholds are not these
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    malloc, free = libc.malloc, libc.free
    malloc.restype, malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    free.restype, free.argtypes = None, [ctypes.c_void_p]
    return malloc, free


def release_freed_heap() -> None:
    """Return freed heap pages to the OS where the C library can (glibc's ``malloc_trim``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def settle_malloc_thresholds() -> bool:
    """Once per process, free one mapped block of :data:`MALLOC_SETTLE_BYTES` so glibc's mmap and trim thresholds
    stand where a process that has run a few forwards has them anyway (see the module doc): temporaries of up to
    31 MiB come from the heap, which keeps up to 62 MiB of freed pages before it is trimmed. Returns whether it
    was done (glibc only)."""
    calls = _libc_malloc()
    if calls is None:
        return False
    malloc, free = calls
    block = malloc(MALLOC_SETTLE_BYTES)
    if block:
        free(block)
    return bool(block)
