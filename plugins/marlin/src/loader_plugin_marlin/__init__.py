"""loader plugin: GPTQ 4/8-bit checkpoints, a packed CPU kernel and the Marlin layout for CUDA.

The torch-side pieces live in ``quantized_weight``, ``gptq_format``,
``kernels`` and ``linear_method``.

Every name is imported on first use (PEP 562): loader imports this package to reach
:mod:`.plugin` in every process that discovers plugins, and a load that does not use this
method should not hold its config classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.lazy import lazy_exports

if TYPE_CHECKING:
    from .config import KERNELS, METHOD_NAME, GPTQConfig, config_from_checkpoint

__all__ = [
    "GPTQConfig",
    "KERNELS",
    "METHOD_NAME",
    "config_from_checkpoint",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "GPTQConfig": ".config",
    "KERNELS": ".config",
    "METHOD_NAME": ".config",
    "config_from_checkpoint": ".config",
})
