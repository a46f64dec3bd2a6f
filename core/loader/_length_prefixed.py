"""Step over an array of length-prefixed records (a uint64 byte count, then the bytes) to find where it ends.

Why: a GGUF header stores its vocabulary and merges as such strings ahead of
the tensor table, and a load needs only the table: stepping over them took
most of a header's parse in a Python loop, little of it in the few lines of C
in ``length_prefixed.c`` (beside this module), compiled on first use and
cached like the packing helpers (:mod:`loader._native_build`). Without a
compiler, or a cache folder to build in, the same loop runs in Python; both
give the same answer.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ._native_build import library_or_none

__all__ = ["u64_prefixed_end"]

SOURCE = Path(__file__).with_name("length_prefixed.c")
_ABI = 1
_U64 = struct.Struct("<Q")
_lock = threading.Lock()
log = logging.getLogger(__name__)


@functools.cache
def _compiled() -> Any | None:
    """The C walker, or ``None`` (the Python loop walks) without a compiler or a library that loads."""
    with _lock:
        library = library_or_none(SOURCE, ("loader_records_abi", _ABI), log,
                                  "walking length-prefixed records in Python")
        if library is None:
            return None
        walk = library.loader_u64_prefixed_end
        walk.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                         ctypes.POINTER(ctypes.c_int64)]
        walk.restype = ctypes.c_int64
        return walk


def u64_prefixed_end(buffer: Any, start: int, count: int, *, compiled: bool = True) -> tuple[int, int]:
    """Step over ``count`` records from byte ``start`` of ``buffer`` (bytes, mmap, anything with the buffer
    protocol); little-endian ``uint64`` byte counts.

    :returns: ``(end, done)``: ``done`` records lie wholly inside the buffer (``count`` when all do) and
        ``end`` is the byte after the last of them; ``done < count`` means record ``done`` runs past the end.
    :param compiled: ``False`` walks in Python (what runs without a C compiler; the tests compare the two).
    """
    # The walker first: finding it reads settings and may raise, and an error raised while this frame holds an
    # export of the caller's map would make closing that map fail (BufferError) and hide the error.
    walk = _compiled() if compiled and count > 0 else None
    with memoryview(buffer) as whole:
        size = whole.nbytes
    if not 0 <= start <= size:
        raise ValueError(f"start {start} is outside the buffer of {size} bytes")
    if walk is not None:
        end = ctypes.c_int64(0)
        view = np.frombuffer(buffer, dtype=np.uint8)
        done = walk(view.ctypes.data, size, start, count, ctypes.byref(end))
        return int(end.value), int(done)
    return _walk_in_python(buffer, size, start, count)


def _walk_in_python(buffer: Any, size: int, pos: int, count: int) -> tuple[int, int]:
    length_of = _U64.unpack_from
    for done in range(count):
        if size - pos < 8:
            return pos, done
        (length,) = length_of(buffer, pos)
        if length > size - pos - 8:
            return pos, done
        pos += 8 + length
    return pos, count
