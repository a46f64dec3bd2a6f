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
from ..errors import SourceNotFoundError
from .weight_map import weight_map_files

__all__ = ["filter_by_remote_index"]


def _named_files(source: Source, index: str) -> set[str]:
    """The relative names the index's ``weight_map`` points at."""
    name = source.relative_name(index) or index
    data = read_source_file(source, name)
    if data is None:
        raise SourceNotFoundError(f"{index}: the weight index the format named cannot be read from the source")
    files = weight_map_files(read_json_object(data, "weight index", index), index)
    base = PurePosixPath(name).parent
    return {str(base / file) if str(base) != "." else str(PurePosixPath(file)) for file in files}


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
