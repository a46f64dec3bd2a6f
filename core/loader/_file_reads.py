"""Positioned reads that fill their destination whole, or say the file is truncated.

Formats and the core read checkpoint bytes at offsets a header promised; a
file that ends early must become one clear :class:`~loader.errors.CheckpointFormatError`
naming the file, the tensor and the bytes missing, wherever the read happens.
"""

from __future__ import annotations

import os
from functools import partial

from ._io_pool import run_in_pool
from .errors import CheckpointFormatError

__all__ = ["PARALLEL_READ_CHUNK_BYTES", "PARALLEL_READ_MIN_BYTES", "pread_exactly", "read_file_range",
           "truncated_error"]

PARALLEL_READ_MIN_BYTES = 16 << 20
""":func:`read_file_range` splits reads of at least this many bytes over the shared I/O pool."""

PARALLEL_READ_CHUNK_BYTES = 8 << 20
"""The pieces it splits them into, one pool task each."""


def truncated_error(path: str, what: str, offset: int, wanted_end: int) -> CheckpointFormatError:
    """The error for a file that ends at ``offset``, before the bytes up to ``wanted_end`` it promised."""
    return CheckpointFormatError(
        f"{path}: {what}: file ends at byte {offset}, before the data the header promises "
        f"(up to byte {wanted_end}); the file is truncated"
    )


def pread_exactly(fd: int, dest: memoryview, offset: int, path: str, what: str) -> None:
    """Fill all of ``dest`` from ``offset`` of ``fd``, looping over short reads (``os.preadv`` leaves the GIL)."""
    done, total = 0, len(dest)
    while done < total:
        got = os.preadv(fd, [dest[done:]], offset + done)
        if got == 0:
            raise truncated_error(path, what, offset + done, offset + total)
        done += got


def read_file_range(path: str, dest: memoryview, offset: int, what: str) -> None:
    """Fill ``dest`` from ``offset`` of the file at ``path`` (opened and closed here); a read of
    :data:`PARALLEL_READ_MIN_BYTES` or more is split over the shared I/O pool (``preadv`` leaves the GIL, and a
    destination of fresh memory faults in on several cores at once)."""
    total = len(dest)
    if not total:
        return
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        if total < PARALLEL_READ_MIN_BYTES:
            pread_exactly(fd, dest, offset, path, what)
            return
        run_in_pool([partial(pread_exactly, fd, dest[start:start + PARALLEL_READ_CHUNK_BYTES], offset + start, path,
                             what) for start in range(0, total, PARALLEL_READ_CHUNK_BYTES)])
    finally:
        os.close(fd)
