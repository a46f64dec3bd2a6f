"""The model registry: architecture name -> lazy class, and what each class can do.

``python -m loader._registry probe ...`` is the probe child (see ``__main__``).
What a class can do (:class:`ModelInfo`, the probe and its disk cache) is imported on first
use (PEP 562): a load resolves and imports its class without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .entry import RegisteredModel
from .registry import ModelChoice, ModelRegistry, get_registry, model_info

if TYPE_CHECKING:
    from .cache import ProbeCache
    from .capabilities import ModelInfo, inspect_model_class

__all__ = [
    "ModelChoice",
    "ModelInfo",
    "ModelRegistry",
    "ProbeCache",
    "RegisteredModel",
    "get_registry",
    "inspect_model_class",
    "model_info",
]

_LAZY = {"ProbeCache": "cache", "ModelInfo": "capabilities", "inspect_model_class": "capabilities"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
