"""loader: turn an LLM checkpoint into a ready ``torch.nn.Module``.

Importing :mod:`loader` is cheap: torch and the pipeline load on first use of
:func:`load_model` or :func:`model_info`, so ``loader plugins`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    from .pipeline.load import LoadReport, load_model, load_model_with_report
    from .registry import ModelInfo, model_info

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
    "hookimpl",
    "load_model",
    "load_model_with_report",
    "model_info",
]

_LAZY = {
    "load_model": ("loader.pipeline.load", "load_model"),
    "load_model_with_report": ("loader.pipeline.load", "load_model_with_report"),
    "LoadReport": ("loader.pipeline.load", "LoadReport"),
    "model_info": ("loader.registry", "model_info"),
    "ModelInfo": ("loader.registry", "ModelInfo"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'loader' has no attribute {name!r}")
