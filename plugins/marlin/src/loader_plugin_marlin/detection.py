"""Decide whether a load is one of this plugin's packed formats, and which.

A checkpoint declaring ``quant_method`` ``gptq``, ``awq`` or
``compressed-tensors`` loads with or without ``quantization=`` naming it;
asking for one of them on a checkpoint that is not of that kind is an error
(these formats need calibration data and are never applied while loading).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from loader.errors import UnsupportedError
from loader.kernels import LoadBundle
from loader.layers import QuantizationConfig

from .awq_format import awq_config_from_checkpoint
from .compressed_tensors_config import CompressedTensorsConfig, ct_config_from_checkpoint
from .config import PackedQuantConfig, config_from_checkpoint, exact_float32_option
from .fp8_config import fbgemm_fp8_config_from_checkpoint, fp8_config_from_checkpoint
from .modelopt_config import modelopt_config_from_checkpoint
from .packed_cache import new_load_cache

__all__ = ["METHODS", "attach_load_cache", "detect_packed", "finish_load_cache"]

METHODS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any] | None], QuantizationConfig]] = {
    "gptq": config_from_checkpoint,
    "awq": awq_config_from_checkpoint,
    "compressed-tensors": ct_config_from_checkpoint,
    "fp8": fp8_config_from_checkpoint,
    "fbgemm_fp8": fbgemm_fp8_config_from_checkpoint,
    "modelopt": modelopt_config_from_checkpoint,
}


def detect_packed(
    hf_config: Mapping[str, Any], requested: str | None, options: Mapping[str, Any] | None
) -> QuantizationConfig | None:
    """The load's config, or ``None`` when the load is not one of these formats."""
    if requested is not None and requested not in METHODS:
        return None
    declared = hf_config.get("quantization_config")
    method = declared.get("quant_method") if isinstance(declared, Mapping) else None
    if method in METHODS and requested in (None, method):
        assert isinstance(declared, Mapping)
        return _with_exact(METHODS[str(method)](declared, options), exact_float32_option(options))
    if requested is None:
        return None
    found = f"declares quant_method={method!r}" if method else "has no quantization_config"
    raise UnsupportedError(
        f"quantization={requested!r} loads checkpoints already quantized that way, but config.json {found}; "
        f"{requested} needs calibration data and is not applied while loading"
    )


def _packed_configs(config: QuantizationConfig) -> list[PackedQuantConfig]:
    """The packed-integer configs of a load's config: itself, or a compressed-tensors checkpoint's groups'."""
    if isinstance(config, PackedQuantConfig):
        return [config]
    if isinstance(config, CompressedTensorsConfig):
        return [group.config for group in config.groups if isinstance(group.config, PackedQuantConfig)]
    return []


def attach_load_cache(config: QuantizationConfig, files: Sequence[str]) -> None:
    """Give every packed-integer config of the load one :class:`~loader.kernels.LoadBundle` for ``files`` (none
    when the bundle is off, or the config packs nothing)."""
    configs = _packed_configs(config)
    load = new_load_cache(files) if configs else None
    for packed in configs:
        packed.packed_cache.load = load


def finish_load_cache(config: QuantizationConfig) -> None:
    """After every layer of a load succeeded: write the load's bundle when it packed a unit it did not find."""
    loads: dict[int, LoadBundle] = {}
    for packed in _packed_configs(config):
        if packed.packed_cache.load is not None:
            loads[id(packed.packed_cache.load)] = packed.packed_cache.load
    for load in loads.values():
        load.finish()


def _with_exact(config: QuantizationConfig, exact: bool) -> QuantizationConfig:
    """``config`` (or each packed group of a compressed-tensors one) with ``exact_float32`` set."""
    if not exact:
        return config
    if isinstance(config, PackedQuantConfig):
        return attrs.evolve(config, exact_float32=True)
    if isinstance(config, CompressedTensorsConfig):
        groups = tuple(attrs.evolve(group, config=_with_exact(group.config, exact)) if group.config else group
                       for group in config.groups)
        return attrs.evolve(config, groups=groups)
    return config
