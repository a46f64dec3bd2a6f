"""Rewrite the zip archive of a ``torch.save`` file: repack it compressed, cut or swap its records.

``torch.save`` writes every record stored (uncompressed, 64-byte aligned); a
checkpoint that passed through another zip tool may be DEFLATE-compressed, and a
damaged one may hold a storage record shorter than its tensor. Python's
``zipfile`` writes both, and ``torch.load(mmap=False)`` reads (or refuses) them
the way the tests compare against.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["data_record_names", "repack_zip"]


def data_record_names(path: Path) -> list[str]:
    """The storage records (``<archive>/data/<key>``) of a ``torch.save`` zip, in archive order."""
    with zipfile.ZipFile(path) as archive:
        return [info.filename for info in archive.infolist() if "/data/" in info.filename]


def repack_zip(source: Path, target: Path, *, compression: int = zipfile.ZIP_STORED,
               edit: Callable[[str, bytes], bytes] | None = None) -> Path:
    """Copy every record of ``source`` into a new archive ``target`` with ``compression``.

    ``edit(name, data)`` may replace a record's bytes on the way (to cut a storage record short).
    """
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w", compression) as repacked:
        for info in original.infolist():
            data = original.read(info.filename)
            repacked.writestr(info.filename, edit(info.filename, data) if edit else data)
    return target
