"""The model registry: architecture name -> lazy class, and what each class can do.

``python -m loader._registry probe ...`` is the probe child (see ``__main__``).
"""

from .cache import ProbeCache
from .capabilities import ModelInfo, inspect_model_class
from .entry import RegisteredModel
from .registry import ModelChoice, ModelRegistry, get_registry, model_info

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
