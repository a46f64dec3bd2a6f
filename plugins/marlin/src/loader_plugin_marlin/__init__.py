"""loader plugin: GPTQ 4/8-bit checkpoints, a packed CPU kernel and the Marlin layout for CUDA.

Only light names are re-exported here (the entry point imports this package
first); the torch-side pieces live in ``quantized_weight``, ``gptq_format``,
``kernels`` and ``linear_method``.
"""

from .config import KERNELS, METHOD_NAME, GPTQConfig, config_from_checkpoint

__all__ = [
    "KERNELS",
    "METHOD_NAME",
    "GPTQConfig",
    "config_from_checkpoint",
]
