"""Reads that convert or scatter checkpoint bytes on their way in, in one pass (``fused_reads.c`` beside this
module, compiled on first use and cached like the other helpers, :mod:`loader._native_build`).

Why: a bfloat16 file loaded as float32, and a row-parallel shard (each row's slice for one rank), were read
into a bounce buffer and copied again by torch or numpy, to stay off memory maps that die of ``SIGBUS`` when
the file is truncated mid-load. The C loops keep the positioned reads (a truncated file reads short, and the
short count becomes :func:`~loader._file_reads.truncated_error`) and drop the second pass: a widening read
converts each 128 KiB piece while it is in the core's cache; a gather gives ``preadv`` the destination's row
slices and one scratch buffer for the gaps. Each call leaves the GIL (ctypes), so the shared I/O pool runs
several at once. Without a compiler (or a cache folder to build in) the callers keep their bounce buffers.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import logging
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._file_reads import truncated_error
from ._native_build import library_or_none
from ._settings import FUSED_READS

if TYPE_CHECKING:
    import torch

__all__ = ["WIDENED_SOURCES", "fused_reads_available", "gather_rows", "read_widening"]

SOURCE = Path(__file__).with_name("fused_reads.c")
_ABI = 1
WIDENED_SOURCES = {"bfloat16": 1, "float16": 2}
"""The source dtypes, by torch name, :func:`read_widening` turns into float32 (with the codes ``fused_reads.c``
takes); names, so that importing ``loader.io`` does not import torch."""
_lock = threading.Lock()
log = logging.getLogger(__name__)


@functools.cache
def _library() -> Any | None:
    """The compiled reads, or ``None`` (the callers' bounce buffers) without a compiler or a loadable library."""
    with _lock:
        library = library_or_none(SOURCE, ("loader_fused_reads_abi", _ABI), log, "reading through bounce buffers")
        if library is None:
            return None
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        library.loader_read_widening.argtypes = [ctypes.c_int, i64, i64, ctypes.c_int, ptr]
        library.loader_read_widening.restype = i64
        library.loader_read_gather.argtypes = [ctypes.c_int, i64, i64, i64, i64, ptr]
        library.loader_read_gather.restype = i64
        return library


def fused_reads_available() -> bool:
    """Whether the compiled reads load here (``LOADER_FUSED_READS=0`` turns them off: the bounce buffers)."""
    return FUSED_READS.read() and _library() is not None


def _failed(code: int, path: str, what: str) -> OSError:
    return OSError(-code, f"{path}: {what}: {os.strerror(-code) if -code in errno.errorcode else code}")


def read_widening(fd: int, offset: int, count: int, source: torch.dtype, out_address: int, *, path: str,
                  what: str) -> None:
    """Read ``count`` values of ``source`` (bfloat16 or float16) from byte ``offset`` of ``fd`` into the float32
    memory at ``out_address``, widened on the way; a file that ends first is
    :class:`~loader.errors.CheckpointFormatError` (the caller checked :func:`fused_reads_available`)."""
    library = _library()
    assert library is not None
    done = library.loader_read_widening(fd, offset, count, WIDENED_SOURCES[str(source).removeprefix("torch.")],
                                        out_address)
    if done < 0:
        raise _failed(done, path, what)
    if done < count:
        raise truncated_error(path, what, min(os.fstat(fd).st_size, offset + done * 2), offset + count * 2)


def gather_rows(fd: int, offset: int, rows: int, row_stride: int, segment: int, out_address: int, *, path: str,
                what: str) -> None:
    """Read ``rows`` slices of ``segment`` bytes, ``row_stride`` apart from byte ``offset`` of ``fd``, packed
    into the memory at ``out_address``; a file that ends first is :class:`~loader.errors.CheckpointFormatError`."""
    library = _library()
    assert library is not None
    done = library.loader_read_gather(fd, offset, rows, row_stride, segment, out_address)
    if done < 0:
        raise _failed(done, path, what)
    if done < rows:
        end = offset + (rows - 1) * row_stride + segment
        raise truncated_error(path, what, min(os.fstat(fd).st_size, end), end)
