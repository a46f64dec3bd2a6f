"""Entry point of loader-plugin-bnb: hook implementations only, imports kept light.

``quantization="bitsandbytes"`` quantizes a dense checkpoint to NF4/FP4 while
it loads; a checkpoint whose ``config.json`` declares
``quantization_config.quant_method == "bitsandbytes"`` loads its packed 4-bit
weights as they are. Both work under tensor parallelism. The config this
plugin returns gives each linear layer its quantize method
(``BitsAndBytesConfig.get_quant_method``); no other hook is needed. torch and
bitsandbytes are imported only when a hook needs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loader.hookspecs import hookimpl

from .names import METHOD_NAME

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions
    from loader.layers import QuantizationConfig

__all__ = ["loader_detect_quantization"]


def _declared_method(hf_config: Mapping[str, Any]) -> object:
    declared = hf_config.get("quantization_config")
    return declared.get("quant_method") if isinstance(declared, Mapping) else None


@hookimpl
def loader_detect_quantization(
    hf_config: Mapping[str, Any], requested: str | None, options: LoadOptions
) -> QuantizationConfig | None:
    if requested is None and _declared_method(hf_config) != METHOD_NAME:
        return None  # the common case, answered before importing the config classes
    from .detection import detect_bitsandbytes

    return detect_bitsandbytes(hf_config, requested, options.quantization_options)
