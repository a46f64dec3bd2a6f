"""Decide whether a load is a GPTQ one.

A checkpoint declaring ``quant_method: "gptq"`` loads as GPTQ with or without
``quantization="gptq"``; asking for GPTQ on a checkpoint that is not GPTQ is
an error (GPTQ needs calibration data, so it is never applied while loading).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from loader.errors import UnsupportedError

from .config import METHOD_NAME, GPTQConfig, config_from_checkpoint

__all__ = ["detect_gptq"]


def detect_gptq(
    hf_config: Mapping[str, Any], requested: str | None, options: Mapping[str, Any] | None
) -> GPTQConfig | None:
    """The load's GPTQ config, or ``None`` when the load is not a GPTQ one."""
    if requested is not None and requested != METHOD_NAME:
        return None
    declared = hf_config.get("quantization_config")
    method = declared.get("quant_method") if isinstance(declared, Mapping) else None
    if method == METHOD_NAME:
        assert isinstance(declared, Mapping)
        return config_from_checkpoint(declared, options)
    if requested is None:
        return None
    found = f"declares quant_method={method!r}" if method else "has no quantization_config"
    raise UnsupportedError(
        f"quantization={METHOD_NAME!r} loads checkpoints GPTQ already quantized, but config.json {found}; "
        "GPTQ needs calibration data and is not applied while loading"
    )
