"""Entry point of loader-plugin-safetensors: hook implementations only, imports kept light.

Detection only looks at file names; iteration imports the readers when a load
starts, so ``loader plugins`` never imports torch through this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.hookspecs import hookimpl

from .detection import FORMATS, detect_weight_format

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions, Source, WeightFormat
    from loader.weights import ReadStats, WeightStream


@hookimpl
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """Safetensors files (a folder's top level, or one file), else ``.bin``/``.pt``."""
    return detect_weight_format(source, requested)


@hookimpl
def loader_iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats
) -> WeightStream | None:
    """Lazy handles over the local files of a ``"safetensors"`` or ``"pt"`` format.

    Remote sources (``source.path is None``) are left to streaming plugins.
    """
    if weight_format.name not in FORMATS or source.path is None:
        return None
    if weight_format.name == "safetensors":
        from .stream import iter_safetensors_weights

        return iter_safetensors_weights(weight_format.files, stats)
    from .pickle_format import iter_pt_weights

    return iter_pt_weights(weight_format.files, stats)
