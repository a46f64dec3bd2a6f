"""The model registry: architecture name -> lazy class, and what each class can do.

``python -m loader._registry probe ...`` is the probe child (see ``__main__``).
What a class can do (:class:`ModelInfo`, the probe and its disk cache) is imported on first
use (PEP 562): a load resolves and imports its class without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports
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

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "ProbeCache": ".cache",
    "ModelInfo": ".capabilities",
    "inspect_model_class": ".capabilities",
})
