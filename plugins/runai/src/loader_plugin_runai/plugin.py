"""Entry point of loader-plugin-runai: hook implementations only, imports kept light.

Nothing here imports torch, boto3 or the streamer at module level, so
``loader plugins`` stays fast; each hook imports what it needs when a load
reaches it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loader.hookspecs import hookimpl

from .detection import FORMATS, detect_local, detect_remote
from .uri import is_object_uri, parse_object_uri

if TYPE_CHECKING:
    from loader.checkpoint import Source, TokenizerBundle, WeightFormat
    from loader.options import LoadOptions
    from loader.weights import ReadStats, WeightStream


def _remote(source: Source) -> bool:
    return source.path is None and source.uri is not None and is_object_uri(source.uri)


@hookimpl
def loader_resolve_source(location: str, options: LoadOptions) -> Source | None:
    """``s3://bucket/prefix``: a remote source streamed without a local copy (nothing is listed yet)."""
    if not is_object_uri(location):
        return None
    from loader.checkpoint import Source

    return Source(location=location, path=None, uri=str(parse_object_uri(location)), revision=options.revision)


@hookimpl
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """``runai_streamer`` / ``runai_streamer_sharded``: any format on ``s3://``, locally only when asked for."""
    from loader import distributed

    rank, size = distributed.tp_rank(), distributed.tp_size()
    if _remote(source):
        return detect_remote(source, requested, rank, size)
    return detect_local(source, requested, rank, size)


@hookimpl
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    """``config.json`` of an ``s3://`` prefix."""
    if not _remote(source):
        return None
    from .s3_folder import S3Folder
    from .side_files import read_remote_config

    return read_remote_config(S3Folder(str(source.uri)))


@hookimpl
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    """The tokenizer files of an ``s3://`` prefix."""
    if not _remote(source):
        return None
    from .s3_folder import S3Folder
    from .side_files import read_remote_tokenizer

    return read_remote_tokenizer(S3Folder(str(source.uri)))


@hookimpl
def loader_iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats
) -> WeightStream | None:
    """Stream this plugin's formats; with ``options.extra["headers_only"]``, headers alone (``loader inspect``)."""
    if weight_format.name not in FORMATS:
        return None
    if options.extra.get("headers_only"):
        from .declared import iter_declared_tensors

        return iter_declared_tensors(weight_format.files, stats)
    from .settings import StreamerSettings
    from .stream import iter_streamed_weights

    settings = StreamerSettings.from_options(options.extra.get("format_options") or {})
    return iter_streamed_weights(weight_format.files, settings, stats, where=source.display(),
                                 snapshot=weight_format.extra.get("snapshot"))
