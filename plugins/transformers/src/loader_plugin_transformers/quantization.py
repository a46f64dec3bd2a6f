"""Which quantizations the fallback takes: bitsandbytes in flight, through the config's own methods.

The fallback's linear layers become loader layers (:mod:`.parallel`) that ask
the load's quantization config for their method, as a native model's do;
transformers' own quantizers are never involved. Other methods
(pre-quantized GPTQ, AWQ, ...) store weights in layouts only a native model
class maps, so they are refused by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.errors import UnsupportedError

if TYPE_CHECKING:
    from loader.layers import QuantizationConfig

__all__ = ["SUPPORTED_METHODS", "check_quantization"]

SUPPORTED_METHODS = ("bitsandbytes",)


def check_quantization(quant_config: QuantizationConfig | None, architecture: str) -> None:
    """Raise :class:`~loader.errors.UnsupportedError` for a method the fallback cannot apply."""
    if quant_config is None:
        return
    method = quant_config.name or type(quant_config).__name__
    if method not in SUPPORTED_METHODS:
        raise UnsupportedError(
            f"{architecture} loads through the transformers fallback, which quantizes only with "
            f"{', '.join(SUPPORTED_METHODS)}; quantization {method!r} needs a native model class for {architecture}"
        )
