"""Entry point of loader-plugin-tensorizer: hook implementations only, imports kept light.

Nothing here imports torch, tensorizer or boto3 at module level, so
``loader plugins`` stays fast; each hook imports what it needs when a load
reaches it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.hookspecs import hookimpl

from .formats import TENSORIZER, is_remote, is_tensors_location
from .options import TensorizerOptions  # attrs and loader.errors only

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions, Source, WeightFormat
    from loader.hookspecs import CliCommand
    from loader.weights import ReadStats, WeightStream


def _claims(location: str, options: LoadOptions) -> bool:
    """Whether a location is this plugin's to resolve (see :mod:`.source`), before parsing any option."""
    if options.load_format not in ("auto", TENSORIZER):
        return False
    if "tensorizer_uri" in options.format_options:
        return True
    if is_tensors_location(location) and (is_remote(location) or "%" in location):
        return True
    return is_remote(location) and options.load_format == TENSORIZER


@hookimpl(tryfirst=True)
def loader_resolve_source(location: str, options: LoadOptions) -> Source | None:
    """A ``.tensors`` URI or ``%03d`` pattern, a remote folder asked for as ``tensorizer``, or ``tensorizer_uri``
    (before the Run:ai plugin claims every ``s3://``)."""
    if not _claims(location, options):
        return None
    from .source import resolve_tensorized

    return resolve_tensorized(location, options.load_format, TensorizerOptions.from_options(options.format_options))


@hookimpl
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """``tensorizer``: this plugin's sources, and local folders or files holding ``.tensors`` files."""
    if requested not in ("auto", TENSORIZER):
        return None
    from loader.models import current_session

    from .detection import detect_tensorized

    session = current_session()
    return detect_tensorized(source, requested, session.tp_rank, session.tp_size)


@hookimpl
def loader_iter_weights(
    weight_format: WeightFormat, options: LoadOptions, stats: ReadStats
) -> WeightStream | None:
    """Every tensor of the chosen files; with ``options.headers_only``, the indexes alone (``loader inspect``)."""
    if weight_format.name != TENSORIZER:
        return None
    from .stream import iter_tensorized

    settings = TensorizerOptions.from_options(options.format_options)
    return iter_tensorized(weight_format.files, settings, stats, headers_only=options.headers_only,
                           parameter_names=weight_format.parameter_names)


@hookimpl
def loader_cli_commands() -> list[CliCommand]:
    """``loader save-tensorized``."""
    from .cli import SaveTensorizedCommand

    return [SaveTensorizedCommand()]
