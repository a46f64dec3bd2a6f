"""loader plugin: bitsandbytes NF4/FP4 quantization for loader, in flight and pre-quantized.

The torch-side pieces live in ``linear_method``, ``packed_tensor``,
``grouping`` and ``codec``.

Every name is imported on first use (PEP 562): loader imports this package to reach
:mod:`.plugin` in every process that discovers plugins, and a load that does not use this
method should not hold its config classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.lazy import lazy_exports

if TYPE_CHECKING:
    from .config import OPTION_NAMES, BitsAndBytesConfig, config_from_checkpoint, config_from_options
    from .names import METHOD_NAME
    from .quant_state import QuantStateHeader, parse_quant_state

__all__ = [
    "BitsAndBytesConfig",
    "METHOD_NAME",
    "OPTION_NAMES",
    "QuantStateHeader",
    "config_from_checkpoint",
    "config_from_options",
    "parse_quant_state",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "BitsAndBytesConfig": ".config",
    "METHOD_NAME": ".names",
    "OPTION_NAMES": ".config",
    "QuantStateHeader": ".quant_state",
    "config_from_checkpoint": ".config",
    "config_from_options": ".config",
    "parse_quant_state": ".quant_state",
})
