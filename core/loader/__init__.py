"""loader: turn an LLM checkpoint into a ready ``torch.nn.Module``.

Importing :mod:`loader` is cheap: torch and the pipeline load on first use of
:func:`load_model` or :func:`model_info`, so ``loader plugins`` stays fast.

The public API is this module, ``loader.errors``, ``loader.hookspecs``,
``loader.weights``, ``loader.checkpoint``, ``loader.io``, ``loader.layers``,
``loader.models``, ``loader.testing`` and ``loader.lazy``, each name in its ``__all__`` (declared once, in
``loader._public_api``); everything else is internal and may change without
notice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import errors
from .errors import (
    CheckpointFormatError,
    ConfigError,
    LoadError,
    MissingWeightsError,
    PluginError,
    ShapeMismatchError,
    SourceNotFoundError,
    UnexpectedWeightError,
    UnknownArchitectureError,
    UnsupportedError,
)
from .hookspecs import hookimpl
from .lazy import lazy_exports

if TYPE_CHECKING:
    __version__: str | None
    from ._pipeline.load import LoadReport, load_model, load_model_with_report
    from ._process_group import set_tensor_parallel_group
    from ._registry import ModelInfo, model_info
    from ._updates.receiving import update_weights_from_distributed
    from ._updates.reload import reload_weights
    from ._updates.sending import send_weights
    from ._updates.transfer import WeightSpec, weight_specs
    from ._updates.update import UpdateReport, update_weights, weights_version

__all__ = [
    "CheckpointFormatError",
    "ConfigError",
    "LoadError",
    "LoadReport",
    "MissingWeightsError",
    "ModelInfo",
    "PluginError",
    "ShapeMismatchError",
    "SourceNotFoundError",
    "UnexpectedWeightError",
    "UnknownArchitectureError",
    "UnsupportedError",
    "UpdateReport",
    "WeightSpec",
    "__version__",
    "errors",
    "hookimpl",
    "load_model",
    "load_model_with_report",
    "model_info",
    "reload_weights",
    "send_weights",
    "set_tensor_parallel_group",
    "update_weights",
    "update_weights_from_distributed",
    "weight_specs",
    "weights_version",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "__version__": "._version",
    "load_model": "._pipeline.load",
    "load_model_with_report": "._pipeline.load",
    "LoadReport": "._pipeline.load",
    "model_info": "._registry",
    "ModelInfo": "._registry",
    "update_weights": "._updates.update",
    "UpdateReport": "._updates.update",
    "weights_version": "._updates.update",
    "reload_weights": "._updates.reload",
    "update_weights_from_distributed": "._updates.receiving",
    "send_weights": "._updates.sending",
    "WeightSpec": "._updates.transfer",
    "weight_specs": "._updates.transfer",
    "set_tensor_parallel_group": "._process_group",
})
