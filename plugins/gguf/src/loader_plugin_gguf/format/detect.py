"""Which GGUF file(s) a source holds: a ``.gguf`` file, a folder with one model, or a split set.

llama.cpp's ``gguf-split`` writes ``name-00001-of-00003.gguf`` ... ``name-00003-of-00003.gguf``;
each part is a complete GGUF file (the first carries the model metadata), so the parts are
listed in order and every one must be present. A file is recognised by its magic bytes, not
its suffix; a file or folder whose name says GGUF but whose bytes do not is an error.
"""

from __future__ import annotations

import re
from pathlib import Path

from loader.checkpoint import Source, WeightFormat
from loader.errors import CheckpointFormatError

from .header import GGUF_MAGIC, sniff

__all__ = ["FORMAT_NAME", "detect_gguf", "gguf_files", "has_magic"]

FORMAT_NAME = "gguf"
_SPLIT = re.compile(r"^(?P<stem>.+)-(?P<part>\d{5})-of-(?P<count>\d{5})\.gguf$")


def has_magic(path: Path) -> bool:
    """Whether ``path`` is a readable file starting with ``GGUF``."""
    try:
        with path.open("rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _split_set(path: Path) -> tuple[Path, ...]:
    """All parts of the split set ``path`` belongs to, in order; just ``(path,)`` if not split."""
    match = _SPLIT.match(path.name)
    if match is None:
        return (path,)
    count = int(match["count"])
    if count < 1 or int(match["part"]) > count:
        raise CheckpointFormatError(f"{path}: split part {int(match['part'])} of {count} is not a valid part")
    parts = tuple(path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1))
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise CheckpointFormatError(f"{path}: split GGUF set is incomplete; missing {', '.join(missing)}")
    return parts


def gguf_files(path: Path) -> tuple[Path, ...] | None:
    """The GGUF file(s) at ``path`` in load order, or ``None`` when there are none."""
    if path.is_file():
        return _split_set(path) if path.suffix == ".gguf" or has_magic(path) else None
    if not path.is_dir():
        return None
    found = sorted(p for p in path.glob("*.gguf") if p.is_file())
    if not found:
        return None
    sets = {_split_set(p) for p in found}
    if len(sets) > 1:
        names = ", ".join(sorted(s[0].name for s in sets))
        raise CheckpointFormatError(f"{path}: folder holds several GGUF models ({names}); pass the file to load")
    return sets.pop()


def detect_gguf(source: Source, requested: str) -> WeightFormat | None:
    """The ``gguf`` format for ``source``, checking every file's magic and version; else ``None``."""
    if requested not in ("auto", FORMAT_NAME) or source.path is None:
        return None
    files = gguf_files(source.path)
    if files is None:
        if requested == FORMAT_NAME:
            raise CheckpointFormatError(f"{source.display()}: no .gguf file here (load_format='gguf')")
        return None
    for file in files:
        sniff(file)
    # "auto" by default: float32 activations (the file's own float tensors are F32) with blocks kept packed
    return WeightFormat(name=FORMAT_NAME, files=tuple(str(f) for f in files), default_dtype="auto")
