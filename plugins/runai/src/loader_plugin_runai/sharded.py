"""``runai_streamer_sharded``: the per-rank files ``loader save-sharded`` writes, one rank's only.

A sharded-state folder holds ``model-rank-{rank}-part-{part}.safetensors``
for every rank and a ``sharded_state.json`` marker naming the TP size it was
cut for. This rank picks its own part files by name, so the streamer fetches
nothing of the other ranks' objects; the pipeline then fills parameters by
name, with no mapping, slicing or post-processing (the core's sharded-state
load). The marker and the part names are checked by the core's own rules
(:func:`loader.checkpoint.read_sharded_marker`, :func:`loader.checkpoint.sharded_part_names`),
so a folder the local ``sharded_state`` format refuses is refused here too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loader.checkpoint import SHARDED_STATE_MARKER, read_sharded_marker, sharded_part_names

__all__ = ["MARKER", "rank_part_names"]

MARKER = SHARDED_STATE_MARKER


def rank_part_names(marker: Path | bytes, marker_name: str, names: Iterable[str], rank: int, tp_size: int,
                    where: str) -> list[str]:
    """This rank's part files among ``names``, in part order, after checking the marker and the load's TP size.

    :param marker: the marker file, or its bytes (an object's) named ``marker_name`` in messages.
    """
    layout = read_sharded_marker(marker, marker_name)
    return sharded_part_names(names, layout, rank, tp_size, where)
