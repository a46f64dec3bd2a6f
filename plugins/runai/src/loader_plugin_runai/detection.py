"""Which files a load streams: ``runai_streamer`` shards (filtered by the index) or this rank's sharded state.

On ``s3://``, ``gs://`` and ``az://`` this plugin is the only reader, so it answers ``auto`` too
(``runai_streamer``, or ``runai_streamer_sharded`` when the prefix holds a
``sharded_state.json`` marker, as the core does for local folders). Locally
it answers only when asked by name: the safetensors plugin reads local files
faster by mapping them.

The core applies the index's ``weight_map`` and drops training artifacts for
both (an object store's index is read through its reader, :mod:`.object_folder`).
"""

from __future__ import annotations

import os
from pathlib import Path

from loader.checkpoint import MAX_JSON_BYTES, Source, WeightFormat
from loader.errors import SourceNotFoundError

from .formats import FORMATS, RUNAI, RUNAI_SHARDED
from .identity import local_snapshot, object_snapshot
from .object_folder import ObjectFolder
from .sharded import MARKER, rank_part_names

__all__ = ["FORMATS", "RUNAI", "RUNAI_SHARDED", "detect_local", "detect_remote"]

SUFFIX = ".safetensors"
STANDARD_INDEX = "model.safetensors.index.json"


def _index_name(names: list[str]) -> str | None:
    """The standard index if present, else the only ``*.safetensors.index.json``."""
    if STANDARD_INDEX in names:
        return STANDARD_INDEX
    found = [n for n in names if n.endswith(".safetensors.index.json")]
    return found[0] if len(found) == 1 else None


def _remote_sharded(folder: ObjectFolder, rank: int, tp_size: int) -> WeightFormat:
    where = str(folder)
    if not folder.has(MARKER):
        raise SourceNotFoundError(
            f"{where}: load_format {RUNAI_SHARDED!r} needs a folder written by 'loader save-sharded' (no {MARKER})"
        )
    raw = folder.read_bytes(MARKER, MAX_JSON_BYTES)
    names = rank_part_names(raw or b"", folder.uri.join(MARKER), folder.list_files(), rank, tp_size, where)
    return WeightFormat(RUNAI_SHARDED, tuple(folder.uri.join(n) for n in names), parameter_names=True,
                        post_processed=True, extra={"snapshot": object_snapshot(folder.store, folder.listing(), names)})


def detect_remote(source: Source, requested: str, rank: int, tp_size: int) -> WeightFormat | None:
    """The format of an ``s3://`` source, or ``None`` for other sources and formats this plugin does not own."""
    folder = source.reader
    if not isinstance(folder, ObjectFolder) or requested not in ("auto", "safetensors", *FORMATS):
        return None
    if requested == RUNAI_SHARDED or (requested == "auto" and folder.has(MARKER)):
        return _remote_sharded(folder, rank, tp_size)
    listed = list(folder.list_files())
    names = [n for n in listed if n.endswith(SUFFIX)]
    if not names:
        shown = ", ".join(listed[:8])
        raise SourceNotFoundError(f"{folder}: no *.safetensors objects under this prefix (found: {shown})")
    index = _index_name(listed)
    return WeightFormat(RUNAI, tuple(folder.uri.join(n) for n in names),
                        index=folder.uri.join(index) if index is not None else None,
                        extra={"snapshot": object_snapshot(folder.store, folder.listing(), names)})


def _local_index(folder: Path) -> str | None:
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    index = _index_name(names)
    return str(folder / index) if index is not None else None


def detect_local(source: Source, requested: str, rank: int, tp_size: int) -> WeightFormat | None:
    """A local folder (or one file) streamed, when the user asked for one of this plugin's formats."""
    if source.path is None or requested not in FORMATS:
        return None
    path = source.path
    if requested == RUNAI_SHARDED:
        if not (path / MARKER).is_file():
            raise SourceNotFoundError(
                f"{path}: load_format {RUNAI_SHARDED!r} needs a folder written by 'loader save-sharded' (no {MARKER})"
            )
        names = rank_part_names(path / MARKER, MARKER, sorted(os.listdir(path)), rank, tp_size, str(path))
        files = [str(path / n) for n in names]
        return WeightFormat(RUNAI_SHARDED, tuple(files), parameter_names=True, post_processed=True,
                            extra={"snapshot": local_snapshot(files)})
    if path.is_file():
        if not path.name.endswith(SUFFIX):
            raise SourceNotFoundError(f"{path}: load_format {RUNAI!r} reads .safetensors files only")
        return WeightFormat(RUNAI, (str(path),), extra={"snapshot": local_snapshot([str(path)])})
    files = sorted(str(p) for p in path.iterdir() if p.name.endswith(SUFFIX) and p.is_file())
    if not files:
        raise SourceNotFoundError(f"{path}: no *.safetensors files to stream")
    return WeightFormat(RUNAI, tuple(files), index=_local_index(path), extra={"snapshot": local_snapshot(files)})
