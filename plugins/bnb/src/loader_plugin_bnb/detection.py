"""Decide whether a load is a bitsandbytes one, and which kind.

* ``quantization="bitsandbytes"`` on a dense checkpoint: quantize in flight
  with ``quantization_options``;
* a checkpoint declaring ``quant_method: "bitsandbytes"`` (with or without the
  request): load it pre-quantized; only ``compute_dtype`` may be overridden,
  since everything else is fixed by the stored tensors;
* asking for bitsandbytes on a checkpoint quantized by another method is an
  error rather than a silent double quantization.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from loader.errors import ConfigError, UnsupportedError

from .config import (
    METHOD_NAME,
    BitsAndBytesConfig,
    check_compute_dtype,
    config_from_checkpoint,
    config_from_options,
)

__all__ = ["detect_bitsandbytes"]


def detect_bitsandbytes(
    hf_config: Mapping[str, Any], requested: str | None, options: Mapping[str, Any] | None
) -> BitsAndBytesConfig | None:
    """The load's bitsandbytes config, or ``None`` when the load is not a bitsandbytes one."""
    if requested is not None and requested != METHOD_NAME:
        return None
    declared = hf_config.get("quantization_config")
    method = declared.get("quant_method") if isinstance(declared, Mapping) else None
    if method == METHOD_NAME:
        assert isinstance(declared, Mapping)
        config = config_from_checkpoint(declared)
        extra = sorted(set(options or {}) - {"compute_dtype"})
        if extra:
            raise ConfigError(
                f"quantization_options {extra} cannot change a checkpoint that is already bitsandbytes-"
                "quantized (config.json quantization_config); only compute_dtype can be set"
            )
        if options and "compute_dtype" in options:
            dtype = check_compute_dtype(options["compute_dtype"], "quantization_options")
            config = attrs.evolve(config, compute_dtype=dtype)
        return config
    if requested is None:
        return None
    if method is not None:
        raise UnsupportedError(
            f"config.json declares quantization_config.quant_method={method!r}; a checkpoint that is already "
            f"quantized cannot be quantized again with {METHOD_NAME}"
        )
    return config_from_options(options)
