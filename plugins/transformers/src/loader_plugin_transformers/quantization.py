"""Which quantizations the fallback takes: bitsandbytes in flight and GGUF blocks kept packed.

The fallback's linear layers become loader layers (:mod:`.parallel`) that ask
the load's quantization config for their method, as a native model's do;
transformers' own quantizers are never involved. GGUF's method (the default
for a GGUF load on the CPU) keeps each layer's blocks from the file, so it
works on those layers unchanged. Other methods
(pre-quantized GPTQ, AWQ, ...) store weights in layouts only a native model
class maps, so they are refused by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.errors import UnsupportedError

if TYPE_CHECKING:
    from loader.layers import QuantizationConfig

__all__ = ["STORED_LAYOUT_METHODS", "SUPPORTED_METHODS", "check_quantization"]

SUPPORTED_METHODS = ("bitsandbytes",)
STORED_LAYOUT_METHODS = ("gguf",)
"""Methods that only keep a format's stored blocks (no quantizing): the fallback's layers take them unchanged."""


def check_quantization(quant_config: QuantizationConfig | None, architecture: str) -> None:
    """Raise :class:`~loader.errors.UnsupportedError` for a method the fallback cannot apply."""
    if quant_config is None:
        return
    method = quant_config.name or type(quant_config).__name__
    if method not in SUPPORTED_METHODS + STORED_LAYOUT_METHODS:
        raise UnsupportedError(
            f"{architecture} loads through the transformers fallback, which quantizes only with "
            f"{', '.join(SUPPORTED_METHODS)}; quantization {method!r} needs a native model class for {architecture}"
        )
