"""loader plugin: bitsandbytes NF4/FP4 quantization for loader, in flight and pre-quantized.

Only light names are re-exported here (the entry point imports this package
first); the torch-side pieces live in ``linear_method``, ``packed_tensor``,
``grouping`` and ``codec``.
"""

from .config import METHOD_NAME, OPTION_NAMES, BitsAndBytesConfig, config_from_checkpoint, config_from_options
from .quant_state import QuantStateHeader, parse_quant_state

__all__ = [
    "METHOD_NAME",
    "OPTION_NAMES",
    "BitsAndBytesConfig",
    "QuantStateHeader",
    "config_from_checkpoint",
    "config_from_options",
    "parse_quant_state",
]
