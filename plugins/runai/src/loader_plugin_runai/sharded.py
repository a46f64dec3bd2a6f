"""``runai_streamer_sharded``: the per-rank files ``loader save-sharded`` writes, one rank's only.

A sharded-state folder holds ``model-rank-{rank}-part-{part}.safetensors``
for every rank and a ``sharded_state.json`` marker naming the TP size it was
cut for. This rank picks its own part files by name, so the streamer fetches
nothing of the other ranks' objects; the pipeline then fills parameters by
name, with no mapping, slicing or post-processing (the core's sharded-state
load).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from loader.errors import CheckpointFormatError, UnsupportedError

__all__ = ["MARKER", "marker_tp_size", "rank_part_names"]

MARKER = "sharded_state.json"
"""The marker ``loader save-sharded`` writes beside the part files (a file-format convention, like the names)."""
_PART = re.compile(r"^model-rank-(\d+)-part-(\d+)\.safetensors$")


def marker_tp_size(data: Mapping[str, Any], where: str) -> int:
    """The TP size the marker says the state was cut for; anything but a positive integer names the marker."""
    tp_size = data.get("tp_size")
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise CheckpointFormatError(f"{where}: field 'tp_size' must be a positive integer, found {tp_size!r}")
    return tp_size


def rank_part_names(names: Iterable[str], saved_tp_size: int, rank: int, tp_size: int, where: str) -> list[str]:
    """This rank's part files in part order; the load's TP size must be the one the state was cut for."""
    if tp_size != saved_tp_size:
        raise UnsupportedError(
            f"{where}: sharded state was saved for tensor parallel size {saved_tp_size}, "
            f"but this load runs with {tp_size}"
        )
    parts: list[tuple[int, str]] = []
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
