"""``mmap``, ``madvise`` and ``mincore`` from the C library, for mapping checkpoint files over parameters.

Python's :mod:`mmap` cannot map at a fixed address nor ask whether pages are
resident; ctypes reaches the C library directly. :data:`libc` is ``None``
where the calls are missing or not safe to make (not Linux, not 64-bit), and
every caller then copies instead of mapping.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["Libc", "libc"]


class Libc:
    """The three calls, typed for 64-bit Linux."""

    def __init__(self) -> None:
        c = ctypes.CDLL(None, use_errno=True)
        self.mmap = c.mmap
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                              ctypes.c_long]
        self.mmap.restype = ctypes.c_void_p
        self.madvise = c.madvise
        self.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.madvise.restype = ctypes.c_int
        self.mincore = c.mincore
        self.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        self.mincore.restype = ctypes.c_int


def _load() -> Libc | None:
    if not sys.platform.startswith("linux") or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    try:
        return Libc()
    except (OSError, AttributeError):
        return None


libc = _load()
