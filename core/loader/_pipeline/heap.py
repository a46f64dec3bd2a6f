"""Give the allocator's freed heap back to the OS once a load is done.

Post-processing builds many short-lived tensors (GGUF blocks decoded into codes,
scales and biases before packing, one layer at a time). glibc keeps what they
freed in its heap for reuse, so a process's RSS after a packed GGUF load
stood well above its parameters with nothing live there. One
``malloc_trim(0)`` after the load returns those pages; elsewhere (musl, macOS)
there is nothing to call and nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

__all__ = ["release_freed_heap"]


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return getattr(libc, "malloc_trim", None)


def release_freed_heap() -> None:
    """Return freed heap pages to the OS where the C library can (glibc's ``malloc_trim``)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
