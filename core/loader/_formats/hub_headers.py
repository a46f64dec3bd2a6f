"""The ``safetensors`` format of a Hub repository inspected in place: its files by URL, headers only.

Registered as core plugin ``core.hub_headers`` with ``tryfirst``. It answers
only for a source :mod:`loader._sources.hub_files` resolved (``loader inspect``
of a Hub id), so every other load is untouched; the format is named
``safetensors`` as the local folder's would be, the index is applied by the
core through the source's reader, and the stream yields
:class:`~loader.weights.HeaderOnlyTensor` handles built from the headers.
"""

from __future__ import annotations

from ..checkpoint import Source, WeightFormat
from ..hookspecs import hookimpl
from ..weights import ReadStats, WeightStream

__all__ = ["loader_detect_format", "loader_iter_weights"]

STANDARD_INDEX = "model.safetensors.index.json"
_READER = "hub_files"


@hookimpl(tryfirst=True)
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    reader = source.reader
    if reader is None:  # a local source: not ours, and no reason to import the Hub reader
        return None
    from .._sources.hub_files import HubFiles

    if not isinstance(reader, HubFiles) or requested not in ("auto", "safetensors"):
        return None
    files = reader.list_files()
    indexes = [f for f in files if f.endswith(".safetensors.index.json") and "/" not in f]
    index = STANDARD_INDEX if STANDARD_INDEX in files else (indexes[0] if len(indexes) == 1 else None)
    return WeightFormat(
        name="safetensors", files=tuple(source.file_uri(f) for f in reader.weight_files()),
        index=source.file_uri(index) if index is not None else None, extra={_READER: reader},
    )


@hookimpl(tryfirst=True)
def loader_iter_weights(source: Source, weight_format: WeightFormat, stats: ReadStats) -> WeightStream | None:
    reader = weight_format.extra.get(_READER)
    if reader is None:
        return None
    from .._sources.hub_files import HubFiles

    if not isinstance(reader, HubFiles):
        return None
    names = [source.relative_name(f) or f for f in weight_format.files]
    return reader.iter_header_tensors(names, stats)
