"""Names and the marker file of a sharded-state folder."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from ..errors import CheckpointFormatError, UnsupportedError

__all__ = ["MARKER", "ShardedLayout", "part_file_name", "rank_files", "read_layout", "validate_marker"]

MARKER = "sharded_state.json"
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
    from ..checkpoint import read_json_object

    return validate_marker(path, read_json_object(path, MARKER))


def validate_marker(path: Path, data: Mapping[str, Any]) -> ShardedLayout:
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
    """This rank's part files in order; the TP size must be the one the state was saved for."""
    if tp_size != layout.tp_size:
        raise UnsupportedError(
            f"{folder}: sharded state was saved for tensor parallel size {layout.tp_size}, "
            f"but this load runs with {tp_size}"
        )
    parts = []
    for path in folder.iterdir():
        match = _PART.match(path.name)
        if match and int(match.group(1)) == rank:
            parts.append((int(match.group(2)), str(path)))
    if not parts:
        raise CheckpointFormatError(f"{folder}: no model-rank-{rank}-part-*.safetensors files for rank {rank}")
    parts.sort()
    expected = list(range(len(parts)))
    if [p for p, _ in parts] != expected:
        raise CheckpointFormatError(
            f"{folder}: rank {rank} has parts {[p for p, _ in parts]}, expected {expected}"
        )
    return tuple(f for _, f in parts)


def write_marker(folder: Path, layout: ShardedLayout) -> None:
    (folder / MARKER).write_text(json.dumps(layout.to_json(), indent=2) + "\n")
