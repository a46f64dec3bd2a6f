"""Which ``.tensors`` files a load reads, and under which names: the checkpoint's or the model's parameters.

Two layouts:

- checkpoint names (``model.tensors``, what tensorizer writes from a ``transformers`` model's
  ``state_dict``): every rank reads the file(s); the model's weight loaders map, fuse and narrow;
- per-rank files (``model-rank-000.tensors`` ..., what ``loader save-tensorized`` and vLLM write): each
  rank reads only its own file, already named by parameter, fused and cut, so the pipeline fills
  parameters with no weight-loader work (the sharded-state rules: the set of files must match the
  load's TP size, checked against the ``tensorized.json`` marker when there is one, else their count).

``auto`` claims a local folder only when it holds ``.tensors`` files and no safetensors, a source this
plugin resolved always.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from loader.checkpoint import MAX_JSON_BYTES, Source, WeightFormat
from loader.errors import CheckpointFormatError, SourceNotFoundError, UnsupportedError

from .formats import MARKER, RANK_FILE, SUFFIX, TENSORIZER, rank_file_name
from .source import TensorizedSource, join

__all__ = ["detect_tensorized"]

ReadMarker = Callable[[], bytes | None]


def _marker_tp_size(raw: bytes, where: str) -> int:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise CheckpointFormatError(f"{where}: {MARKER} is not valid JSON ({exc})") from exc
    tp_size = data.get("tp_size") if isinstance(data, dict) else None
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise CheckpointFormatError(f"{where}: {MARKER} field 'tp_size' must be a positive integer, "
                                    f"found {json.dumps(tp_size)}")
    return tp_size


def _per_rank(folder: str, names: Sequence[str], marker: ReadMarker, rank: int, tp_size: int,
              where: str) -> WeightFormat:
    """This rank's file of a per-rank folder, after checking the files against the load's TP size."""
    ranks = sorted(int(m.group(1)) for n in names if (m := RANK_FILE.match(n)))
    raw = marker()
    saved_for = _marker_tp_size(raw, where) if raw is not None else len(ranks)
    if ranks != list(range(saved_for)):
        raise CheckpointFormatError(
            f"{where}: holds per-rank files for ranks {ranks} but {MARKER} says tensor parallel size {saved_for} "
            f"(expected {rank_file_name(0)} to {rank_file_name(saved_for - 1)})"
        )
    if saved_for != tp_size:
        raise UnsupportedError(
            f"{where}: holds {saved_for} per-rank tensorized file(s), written for tensor parallel size "
            f"{saved_for}, but this load runs with tensor parallel size {tp_size} (write them again with "
            f"'loader save-tensorized ... -tp {tp_size}')"
        )
    return WeightFormat(TENSORIZER, (join(folder, rank_file_name(rank)),), parameter_names=True,
                        post_processed=True)


def _in_folder(folder: str, names: Sequence[str], marker: ReadMarker, rank: int, tp_size: int,
               where: str) -> WeightFormat | None:
    if MARKER in names or any(RANK_FILE.match(n) for n in names):
        return _per_rank(folder, names, marker, rank, tp_size, where)
    files = sorted(n for n in names if n.endswith(SUFFIX))
    if not files:
        return None
    return WeightFormat(TENSORIZER, tuple(join(folder, n) for n in files))


def _explicit(reader: TensorizedSource, location: str, rank: int, tp_size: int) -> WeightFormat:
    """``tensorizer_uri`` or a ``.tensors`` SOURCE: one file, or ``%03d`` standing for this rank."""
    if "%" not in location:
        return WeightFormat(TENSORIZER, (location,))
    try:
        mine = location % rank
    except (TypeError, ValueError) as exc:
        raise UnsupportedError(f"{location}: a per-rank tensorizer URI takes one %03d for the rank") from exc
    names = reader.list_files()
    marker = reader.read_bytes(MARKER, MAX_JSON_BYTES) if MARKER in names else None
    if marker is not None:
        saved_for = _marker_tp_size(marker, location)
        if saved_for != tp_size:
            raise UnsupportedError(
                f"{location}: holds {saved_for} per-rank tensorized file(s), written for tensor parallel size "
                f"{saved_for}, but this load runs with tensor parallel size {tp_size}"
            )
    return WeightFormat(TENSORIZER, (mine,), parameter_names=True, post_processed=True)


def _local(path: Path, requested: str, rank: int, tp_size: int) -> WeightFormat | None:
    if path.is_file():
        return WeightFormat(TENSORIZER, (str(path),)) if path.name.endswith(SUFFIX) else None
    if not path.is_dir():
        return None  # a socket, a device, a dangling name: the core names the path it cannot open
    names = sorted(os.listdir(path))
    if requested == "auto" and any(n.endswith(".safetensors") for n in names):
        return None  # a folder with safetensors beside .tensors loads as safetensors unless asked

    def marker() -> bytes | None:
        file = path / MARKER
        return file.read_bytes()[:MAX_JSON_BYTES + 1] if file.is_file() else None

    return _in_folder(str(path), names, marker, rank, tp_size, str(path))


def detect_tensorized(source: Source, requested: str, rank: int, tp_size: int) -> WeightFormat | None:
    """The tensorizer format of ``source`` with this rank's files, or ``None`` when it holds none."""
    if requested not in ("auto", TENSORIZER):
        return None
    reader = source.reader
    if isinstance(reader, TensorizedSource):
        if reader.tensors is not None:
            return _explicit(reader, reader.tensors, rank, tp_size)
        names = reader.list_files()
        found = _in_folder(reader.folder, names, lambda: reader.read_bytes(MARKER, MAX_JSON_BYTES), rank, tp_size,
                           reader.folder)
        if found is None:
            shown = ", ".join(list(names)[:8]) or "nothing"
            raise SourceNotFoundError(f"{reader.folder}: no *{SUFFIX} files there (found: {shown})")
        return found
    if source.path is None:
        return None
    found = _local(source.path, requested, rank, tp_size)
    if found is None and requested == TENSORIZER:
        raise SourceNotFoundError(f"{source.path}: load_format 'tensorizer' found no *{SUFFIX} files")
    return found
