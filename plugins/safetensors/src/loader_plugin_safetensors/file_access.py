"""An open file descriptor shared by a file's tensors, open only while someone needs it.

The weight iterator *holds* a file while it yields that file's tensors, so
the reads in between reuse one descriptor; it releases the file when it moves
on (or is abandoned), which closes the descriptor. A tensor read after that
(a model that keeps a handle for later) *borrows* the descriptor: it is
reopened for the read and closed again, so a long checkpoint never piles up
open files. Positioned reads (``pread``) share one descriptor safely across
threads, so borrowing is the only bookkeeping needed.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from loader.errors import CheckpointFormatError

__all__ = ["SharedDescriptor"]

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)


class SharedDescriptor:
    """Reference-counted ``os.open`` of one path: :meth:`hold`/:meth:`release` and :meth:`borrow`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._holds = 0
        self._borrows = 0

    @property
    def is_open(self) -> bool:
        return self._fd is not None

    def _ensure_open(self) -> int:
        if self._fd is None:
            try:
                self._fd = os.open(self.path, _OPEN_FLAGS)
            except OSError as exc:
                raise CheckpointFormatError(f"{self.path}: cannot open: {exc.strerror or exc}") from exc
        return self._fd

    def _close_if_unused(self) -> None:
        if self._fd is not None and self._holds == 0 and self._borrows == 0:
            fd, self._fd = self._fd, None
            os.close(fd)

    def hold(self) -> int:
        """Open (if needed) and keep open until the matching :meth:`release`."""
        with self._lock:
            fd = self._ensure_open()
            self._holds += 1
            return fd

    def release(self) -> None:
        """Undo one :meth:`hold`; the descriptor closes once nobody holds or borrows it."""
        with self._lock:
            if self._holds > 0:
                self._holds -= 1
            self._close_if_unused()

    @contextmanager
    def borrow(self) -> Iterator[int]:
        """The descriptor for the duration of a read, opened for it if nobody holds it."""
        with self._lock:
            fd = self._ensure_open()
            self._borrows += 1
        try:
            yield fd
        finally:
            with self._lock:
                self._borrows -= 1
                self._close_if_unused()
