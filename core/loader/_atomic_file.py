"""Write a file whole or not at all: a temporary file beside it, renamed over it when the writing succeeds.

Readers see the old file or the new one, never half of either (one that
mapped the old file keeps it); a failed write removes its temporary file, and
a crash leaves only a ``*.tmp`` beside the target. ``durable`` adds the two
fsyncs (the data, then the folder's entry) that make the new file survive a
power loss, for files that cost much to rebuild.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any

__all__ = ["replaced_atomically"]


@contextmanager
def replaced_atomically(path: Path, *, mode: str = "wb", prefix: str, durable: bool = False) -> Iterator[IO[Any]]:
    """A handle (opened with ``mode``, ``"w"`` or ``"wb"``) whose file replaces ``path`` when the block ends.

    :param prefix: how the temporary file's name starts (it ends in ``.tmp``), in ``path``'s folder.
    :raises OSError: when the folder or the file cannot be written; ``path`` is then untouched.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(descriptor, mode, encoding=None if "b" in mode else "utf-8") as handle:
            yield handle
            if durable:
                handle.flush()
                os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    if durable:
        _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with suppress(OSError):
            os.fsync(descriptor)
    finally:
        os.close(descriptor)
