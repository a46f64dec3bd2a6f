"""loader: turn an LLM checkpoint into a ready ``torch.nn.Module``.

Importing :mod:`loader` is cheap: torch and the pipeline load on first use of
:func:`load_model` or :func:`model_info`, so ``loader plugins`` stays fast.

The public API is this module, ``loader.errors``, ``loader.hookspecs``,
``loader.weights``, ``loader.checkpoint``, ``loader.io``, ``loader.layers``,
``loader.models`` and ``loader.testing``, each name in its ``__all__`` (declared once, in
``loader._public_api``); everything else is internal and may change without
notice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    __version__: str | None
    from ._pipeline.load import LoadReport, load_model, load_model_with_report
    from ._registry import ModelInfo, model_info

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
    "__version__",
    "errors",
    "hookimpl",
    "load_model",
    "load_model_with_report",
    "model_info",
]

_LAZY = {
    "load_model": ("loader._pipeline.load", "load_model"),
    "load_model_with_report": ("loader._pipeline.load", "load_model_with_report"),
    "LoadReport": ("loader._pipeline.load", "LoadReport"),
    "model_info": ("loader._registry", "model_info"),
    "ModelInfo": ("loader._registry", "ModelInfo"),
}


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from ._plugins import _core_version

        globals()[name] = _core_version()
        return globals()[name]
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'loader' has no attribute {name!r}")
