"""Positioned reads that fill their destination whole, or say the file is truncated.

Formats and the core read checkpoint bytes at offsets a header promised; a
file that ends early must become one clear :class:`~loader.errors.CheckpointFormatError`
naming the file, the tensor and the bytes missing, wherever the read happens.
"""

from __future__ import annotations

import os

from .errors import CheckpointFormatError

__all__ = ["pread_exactly", "truncated_error"]


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
