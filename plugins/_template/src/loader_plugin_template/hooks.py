"""Entry point of loader-plugin-template: the two hooks of a format plugin, imports kept light.

Detection looks at file names only; the reader (numpy, torch) is imported when
a load starts, so ``loader plugins`` never imports torch through this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.checkpoint import WeightFormat
from loader.hookspecs import hookimpl

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions, Source
    from loader.weights import ReadStats, WeightStream

__all__ = ["FORMAT", "loader_detect_format", "loader_iter_weights"]

FORMAT = "npz"
"""The format's name: what ``load_format=`` selects and ``loader load --load-format`` accepts."""


@hookimpl(trylast=True)
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """A folder's top-level ``*.npz`` files, or one ``.npz`` file given directly.

    ``trylast``: with ``load_format="auto"`` a folder that also holds safetensors
    loads those, as it did before this plugin was installed.
    """
    if source.path is None or requested not in ("auto", FORMAT):
        return None  # a remote source, or another format asked for by name
    path = source.path
    if path.is_file():
        return WeightFormat(FORMAT, (str(path),)) if path.suffix == ".npz" else None
    files = sorted(str(p) for p in path.glob("*.npz") if p.is_file()) if path.is_dir() else []
    return WeightFormat(FORMAT, tuple(files)) if files else None


@hookimpl
def loader_iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats
) -> WeightStream | None:
    """Unread handles on every array of the format's archives; ``None`` for any other format."""
    if weight_format.name != FORMAT:
        return None
    from .npz import iter_npz_weights

    return iter_npz_weights(weight_format.files, stats)
