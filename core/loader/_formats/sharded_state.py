"""``load_format="sharded_state"``: each rank reads back its own post-processed parameters.

Registered as core plugin ``core.sharded_state`` with ``tryfirst``: a folder
marked by ``sharded_state.json`` is sharded state even under
``load_format="auto"``, before any format plugin claims its ``.safetensors``
files. The files are read by the core's own reader
(:mod:`loader._sharded.reader`), so no format plugin is needed to load them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .._session import current_session
from .._sharded_layout import MARKER, rank_files, read_layout
from ..checkpoint import Source, WeightFormat
from ..errors import SourceNotFoundError
from ..hookspecs import hookimpl

if TYPE_CHECKING:
    from ..weights import CheckpointTensor, ReadStats

__all__ = ["SHARDED_STATE", "loader_detect_format", "loader_iter_weights"]

SHARDED_STATE = "sharded_state"


@hookimpl(tryfirst=True)
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """This rank's part files when the source is a sharded-state folder (asked for, or marked as one)."""
    if requested not in ("auto", SHARDED_STATE) or source.directory is None:
        return None

    layout = read_layout(source.directory)
    if layout is None:
        if requested == SHARDED_STATE:
            raise SourceNotFoundError(
                f"{source.display()}: load_format 'sharded_state' needs a folder written by "
                f"'loader save-sharded' (no {MARKER})"
            )
        return None
    session = current_session()
    files = rank_files(source.directory, layout, session.tp_rank, session.tp_size)
    return WeightFormat(name=SHARDED_STATE, files=files, parameter_names=True, post_processed=True)


@hookimpl
def loader_iter_weights(weight_format: WeightFormat, stats: ReadStats
                        ) -> Iterator[tuple[str, CheckpointTensor]] | None:
    if weight_format.name != SHARDED_STATE:
        return None
    from .._sharded.reader import iter_part_files  # a sharded load only: every other load leaves it out

    return iter_part_files(weight_format.files, stats)
