"""The index rule of step 1 for a source with no local folder (``s3://``, an in-memory store).

A local folder's index is checked on disk (:func:`loader._pipeline.prepare.filter_weight_files`);
a remote source's index is read as bytes through its
:class:`~loader.checkpoint.SourceReader` and its ``weight_map`` applied to the
files' relative names (:meth:`~loader.checkpoint.Source.relative_name`), so a
remote-source plugin gets the same filtering without writing it again.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from ..checkpoint import Source, WeightFormat, read_json_object, read_source_file
from ..errors import CheckpointFormatError, SourceNotFoundError

__all__ = ["filter_by_remote_index"]


def _named_files(source: Source, index: str) -> set[str]:
    """The relative names the index's ``weight_map`` points at."""
    name = source.relative_name(index) or index
    data = read_source_file(source, name)
    if data is None:
        raise SourceNotFoundError(f"{index}: the weight index the format named cannot be read from the source")
    weight_map = read_json_object(data, "weight index", index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointFormatError(f"{index}: 'weight_map' must be a non-empty object of tensor -> file")
    base = PurePosixPath(name).parent
    named: set[str] = set()
    for tensor, file in weight_map.items():
        if not isinstance(file, str) or not file:
            raise CheckpointFormatError(f"{index}: weight_map[{tensor!r}] must be a file name, found {file!r}")
        rel = PurePosixPath(file)
        if rel.is_absolute() or ".." in rel.parts:
            raise CheckpointFormatError(
                f"{index}: weight_map[{tensor!r}] = {file!r} points outside the model folder"
            )
        named.add(str(base / rel) if str(base) != "." else str(rel))
    return named


def filter_by_remote_index(source: Source, weight_format: WeightFormat, files: list[str]) -> list[str]:
    """``files`` the index names, in order; fail naming any shard the index names but the format did not list."""
    assert weight_format.index is not None
    named = _named_files(source, weight_format.index)
    kept = [f for f in files if source.relative_name(f) in named]
    listed = {source.relative_name(f) for f in kept}
    absent = sorted(named - listed)
    if absent:
        raise SourceNotFoundError(
            f"{weight_format.index}: the index names shard(s) the {weight_format.name} format did not "
            f"list: {', '.join(absent)}"
        )
    return kept
