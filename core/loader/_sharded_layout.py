"""Names and the marker file of a sharded-state folder: the one set of checks for every reader of one.

The core's ``sharded_state`` format reads local folders; the Run:ai plugin's
``runai_streamer_sharded`` reads the same layout from ``s3://`` (through
:mod:`loader.checkpoint`, which makes :func:`read_marker` and :func:`part_names`
public), so a marker or a set of part files one refuses, both refuse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import attrs

from ._json_files import read_json_object
from .errors import CheckpointFormatError, UnsupportedError

__all__ = ["MARKER", "ShardedLayout", "part_file_name", "part_names", "rank_files", "read_layout", "read_marker",
           "validate_marker"]

MARKER = "sharded_state.json"
"""The marker ``loader save-sharded`` writes beside the part files."""
_PART = re.compile(r"^model-rank-(\d+)-part-(\d+)\.safetensors$")


def part_file_name(rank: int, part: int) -> str:
    return f"model-rank-{rank}-part-{part}.safetensors"


@attrs.frozen
class ShardedLayout:
    """What the marker says: the TP size the state was cut for and how it was loaded."""

    tp_size: int
    dtype: str
    architecture: str
    loader_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


def read_layout(folder: Path) -> ShardedLayout | None:
    """The folder's marker, or ``None`` if it is not a sharded-state folder."""
    path = folder / MARKER
    if not path.is_file():
        return None
    return read_marker(path)


def read_marker(source: Path | bytes, where: str | None = None) -> ShardedLayout:
    """The marker's fields from its file, or from its bytes (an object's) named ``where`` in messages.

    :raises ConfigError: if it is not a JSON object.
    :raises CheckpointFormatError: if a field is missing or of the wrong kind.
    """

    name = (where or MARKER) if isinstance(source, bytes) else str(source)
    return validate_marker(name, read_json_object(source, MARKER, name))


def validate_marker(path: Path | str, data: Mapping[str, Any]) -> ShardedLayout:
    """The marker's fields, each checked by name: ``int(...)`` would take ``1.9`` and ``true`` as 1 and
    fail on ``Infinity`` with a bare ``OverflowError``."""

    def field(name: str, kinds: type | tuple[type, ...], expected: str, *, required: bool = True) -> Any:
        value = data.get(name)
        if value is None and not required:
            return None
        if isinstance(value, bool) or not isinstance(value, kinds):
            found = "nothing" if name not in data else json.dumps(value)[:80]  # as the file spells it
            raise CheckpointFormatError(f"{path}: field {name!r} must be {expected}, found {found}")
        return value

    tp_size = field("tp_size", int, "a positive integer")
    if tp_size < 1:
        raise CheckpointFormatError(f"{path}: field 'tp_size' must be a positive integer, found {tp_size}")
    return ShardedLayout(tp_size=tp_size, dtype=field("dtype", str, "a dtype name"),
                         architecture=field("architecture", str, "an architecture name"),
                         loader_version=field("loader_version", str, "a version string", required=False))


def rank_files(folder: Path, layout: ShardedLayout, rank: int, tp_size: int) -> tuple[str, ...]:
    """This rank's part files in the folder, in order (see :func:`part_names`)."""
    names = part_names((p.name for p in folder.iterdir()), layout, rank, tp_size, str(folder))
    return tuple(str(folder / name) for name in names)


def part_names(names: Iterable[str], layout: ShardedLayout, rank: int, tp_size: int, where: str) -> list[str]:
    """This rank's part files among ``names`` (a folder's or a prefix's), in part order.

    :raises UnsupportedError: if the load's TP size is not the one the state was saved for.
    :raises CheckpointFormatError: if the rank has no parts, or its part numbers have a gap.
    """
    if tp_size != layout.tp_size:
        raise UnsupportedError(
            f"{where}: sharded state was saved for tensor parallel size {layout.tp_size}, "
            f"but this load runs with {tp_size}"
        )
    parts = []
    for name in names:
        match = _PART.match(name)
        if match and int(match.group(1)) == rank:
            parts.append((int(match.group(2)), name))
    if not parts:
        raise CheckpointFormatError(f"{where}: no model-rank-{rank}-part-*.safetensors files for rank {rank}")
    parts.sort()
    numbers = [p for p, _ in parts]
    if numbers != list(range(len(parts))):
        raise CheckpointFormatError(f"{where}: rank {rank} has parts {numbers}, expected {list(range(len(parts)))}")
    return [name for _, name in parts]


def write_marker(folder: Path, layout: ShardedLayout) -> None:
    (folder / MARKER).write_text(json.dumps(layout.to_json(), indent=2) + "\n")
