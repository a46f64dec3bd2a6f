"""Cache folders that cannot be written: a read-only or a full file system, mounted where the test asks.

Root ignores permission bits (``chmod 0o555`` stops nobody here), so a read-only folder is a tmpfs mounted
read-only, and a full disk is a small tmpfs filled to its last byte. Both need ``mount`` (root, or a user
namespace that allows it); where it is refused the test is skipped with the reason ``mount`` gave.
"""

from __future__ import annotations

import errno
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["fill", "remount_read_only", "tmpfs"]


def _mount(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["mount", *args], capture_output=True, text=True, check=False)


@contextmanager
def tmpfs(path: Path, size: str = "4m") -> Iterator[Path]:
    """A fresh tmpfs of ``size`` mounted on ``path`` (made first) for the block; skips the test where mounting
    is not permitted. Unmounted lazily afterwards: a model may still map a file from it."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = _mount("-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    except FileNotFoundError:
        pytest.skip("no mount command to mount a small tmpfs with")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def remount_read_only(path: Path) -> None:
    """Make the tmpfs on ``path`` read-only (what it holds stays readable)."""
    done = _mount("-o", "remount,ro", str(path))
    if done.returncode != 0:
        pytest.skip(f"cannot remount {path} read-only: {done.stderr.strip()}")


def fill(path: Path) -> None:
    """Write ``path/filler`` until the file system holding ``path`` has no byte left."""
    chunk = bytes(1 << 16)
    with (path / "filler").open("wb", buffering=0) as out:
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    out.write(chunk[:size])
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
