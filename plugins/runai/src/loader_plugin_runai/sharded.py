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
from loader.sharded.layout import MARKER, ShardedLayout

__all__ = ["MARKER", "layout_from_json", "rank_part_names"]

_PART = re.compile(r"^model-rank-(\d+)-part-(\d+)\.safetensors$")


def layout_from_json(data: Mapping[str, Any], where: str) -> ShardedLayout:
    """The marker's fields; a missing or malformed one names the marker."""
    try:
        return ShardedLayout(tp_size=int(data["tp_size"]), dtype=str(data["dtype"]),
                             architecture=str(data["architecture"]), loader_version=data.get("loader_version"))
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointFormatError(f"{where}: marker is missing or has a bad field: {exc}") from exc


def rank_part_names(names: Iterable[str], layout: ShardedLayout, rank: int, tp_size: int, where: str) -> list[str]:
    """This rank's part files in part order; the load's TP size must be the one the state was cut for."""
    if tp_size != layout.tp_size:
        raise UnsupportedError(
            f"{where}: sharded state was saved for tensor parallel size {layout.tp_size}, "
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
