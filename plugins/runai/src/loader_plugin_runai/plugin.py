"""Entry point of loader-plugin-runai: hook implementations only, imports kept light.

Nothing here imports torch, boto3 or the streamer at module level, so
``loader plugins`` stays fast; each hook imports what it needs when a load
reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.hookspecs import hookimpl

from .formats import FORMATS, is_object_uri

if TYPE_CHECKING:
    from torch import nn

    from loader.checkpoint import LoadOptions, Source, WeightFormat
    from loader.weights import ReadStats, WeightStream


def _remote(source: Source) -> bool:
    return source.path is None and source.uri is not None and is_object_uri(source.uri)


@hookimpl
def loader_resolve_source(location: str, options: LoadOptions) -> Source | None:
    """``s3://bucket/prefix``: a remote source streamed without a local copy; its reader lists it when asked."""
    if not is_object_uri(location):
        return None
    from loader.checkpoint import Source

    from .object_folder import ObjectFolder
    from .uri import parse_object_uri

    folder = ObjectFolder(parse_object_uri(location))
    return Source(location=location, path=None, uri=str(folder.uri), revision=options.revision, reader=folder)


@hookimpl
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """``runai_streamer`` / ``runai_streamer_sharded``: any format on ``s3://``, locally only when asked for."""
    from loader.models import current_session

    session = current_session()
    rank, size = session.tp_rank, session.tp_size
    if _remote(source):
        from .detection import detect_remote

        return detect_remote(source, requested, rank, size)
    if source.path is None or requested not in FORMATS:
        return None  # locally, only a load that asks for a streamer format by name (detect_local's first test)
    from .detection import detect_local

    return detect_local(source, requested, rank, size)


@hookimpl
def loader_iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats, model: nn.Module
) -> WeightStream | None:
    """Stream this plugin's formats; with ``options.headers_only``, headers alone (``loader inspect``)."""
    if weight_format.name not in FORMATS:
        return None
    snapshot = weight_format.extra.get("snapshot")
    if snapshot is not None:
        snapshot = snapshot.only(weight_format.files)
    if options.headers_only:
        from .headers import iter_declared_tensors

        return iter_declared_tensors(weight_format.files, snapshot, stats)
    from .settings import StreamerSettings
    from .stream import iter_streamed_weights

    settings = StreamerSettings.from_options(options.format_options)
    return iter_streamed_weights(weight_format.files, settings, stats, where=source.display(), snapshot=snapshot,
                                 model=model)
