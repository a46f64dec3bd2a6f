"""Populating the page tables of parameters mapped from a checkpoint file, at the end of a load.

Mapping makes a parameter's contents right at once; populating only makes
the pages present, so that the first forward pass does not fault them in.
It costs about what copying would, runs in the kernel without the GIL and
splits across threads, but it holds the address space lock that ``mmap``
needs: run while parameters are still being mapped, it slows every ``mmap``
call down as much as it saves. So inside a load the ranges are collected and
populated together on a thread pool when the weights are all in place
(:func:`background_population`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING

from ._io_pool import run_in_pool
from ._libc import libc
from .errors import CheckpointFormatError

if TYPE_CHECKING:
    from .weights import CheckpointTensor

__all__ = ["background_population", "populate_soon"]

_MADV_POPULATE_READ = 22  # Linux 5.14+; older kernels answer EINVAL and the pages fault in on first use
_POPULATE_CHUNK = 32 << 20
_scope = threading.local()


def _populate(address: int, length: int, loaded: CheckpointTensor) -> None:
    """Fault the mapped pages in now (shared with the page cache), so the load ends with them resident."""
    assert libc is not None
    if libc.madvise(address, length, _MADV_POPULATE_READ) == 0:
        return
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
        return  # an older kernel: pages fault in on first use instead
    if code == errno.EFAULT:  # the kernel's answer where touching the page would have been a SIGBUS
        raise CheckpointFormatError(f"{loaded.describe()}: the file's pages are gone: the file was truncated "
                                    "while it was being loaded")
    raise CheckpointFormatError(f"{loaded.describe()}: cannot read the file's pages: {os.strerror(code)}")


@contextlib.contextmanager
def background_population() -> Iterator[None]:
    """Defer populating mapped pages to the end of the block, then do it on a thread pool and wait.

    A failure to read the file's pages (an I/O error) is raised there. Outside
    such a block, pages are populated before
    :func:`~loader._mapped_parameters.fill_parameter` returns.
    """
    outer = getattr(_scope, "pending", None)
    pending: list[tuple[int, int, CheckpointTensor]] = []
    _scope.pending = pending
    try:
        yield
    finally:
        _scope.pending = outer
    _populate_all(pending)


def _populate_all(ranges: list[tuple[int, int, CheckpointTensor]]) -> None:
    """Populate ``ranges`` in pieces of :data:`_POPULATE_CHUNK` on the shared I/O pool."""
    run_in_pool([partial(_populate, start, min(_POPULATE_CHUNK, address + length - start), loaded)
                 for address, length, loaded in ranges
                 for start in range(address, address + length, _POPULATE_CHUNK)])


def populate_soon(address: int, length: int, loaded: CheckpointTensor) -> None:
    """Populate ``length`` mapped bytes at ``address`` now, or at the end of the enclosing
    :func:`background_population` block."""
    pending: list[tuple[int, int, CheckpointTensor]] | None = getattr(_scope, "pending", None)
    if pending is None:
        _populate(address, length, loaded)
    else:
        pending.append((address, length, loaded))
