"""The index's ``weight_map``, checked once for every source: what it names and that each name stays inside.

A local folder (:mod:`.prepare`) then checks the named files on disk; a remote
source (:mod:`.remote_index`) matches them against the files its format listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Any

from ..errors import CheckpointFormatError

__all__ = ["weight_map_files"]


def weight_map_files(index: Mapping[str, Any], where: str, max_files: int | None = None) -> dict[str, str]:
    """Each file the ``weight_map`` names, with the first tensor that names it (each file once).

    :param where: how messages name the index.
    :param max_files: refuse an index naming more different files than this (``None``: no bound).
    :raises CheckpointFormatError: an empty or malformed map, a name that is not a file name, too many
        files, or a name that is absolute or climbs out with ``..``.
    """
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointFormatError(f"{where}: 'weight_map' must be a non-empty object of tensor -> file")
    first_tensor: dict[str, str] = {}  # each file once, however many tensors name it
    for tensor, file in weight_map.items():
        if not isinstance(file, str) or not file:
            raise CheckpointFormatError(f"{where}: weight_map[{tensor!r}] must be a file name, found {file!r}")
        first_tensor.setdefault(file, tensor)
    if max_files is not None and len(first_tensor) > max_files:
        raise CheckpointFormatError(
            f"{where}: weight_map names {len(first_tensor)} different files, more than the "
            f"{max_files} a checkpoint may be split into"
        )
    for file, tensor in first_tensor.items():
        rel = PurePosixPath(file)
        if rel.is_absolute() or ".." in rel.parts:
            raise CheckpointFormatError(f"{where}: weight_map[{tensor!r}] = {file!r} points outside the model folder")
    return first_tensor
