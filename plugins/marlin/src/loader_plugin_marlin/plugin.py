"""Entry point of loader-plugin-marlin: hook implementations only, imports kept light.

A checkpoint whose ``config.json`` declares ``quantization_config.quant_method
== "gptq"`` loads its packed 4/8-bit weights as they are; the config this
plugin returns gives each linear layer its quantize method
(:meth:`~loader_plugin_marlin.config.GPTQConfig.get_quant_method`), so no
other hook is needed. torch is imported only when a layer is built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loader.hookspecs import hookimpl

from .names import DECLARED_METHODS

if TYPE_CHECKING:
    from collections.abc import Generator

    import torch
    from torch import nn

    from loader.checkpoint import LoadOptions
    from loader.layers import QuantizationConfig

__all__ = ["loader_detect_quantization", "loader_process_weights_after_loading"]


def _declared_method(hf_config: Mapping[str, Any]) -> object:
    declared = hf_config.get("quantization_config")
    return declared.get("quant_method") if isinstance(declared, Mapping) else None


@hookimpl
def loader_detect_quantization(
    hf_config: Mapping[str, Any], requested: str | None, options: LoadOptions
) -> QuantizationConfig | None:
    """The config of a GPTQ, AWQ, compressed-tensors, FP8 or ModelOpt checkpoint; a packed-integer one gets the
    load's packed-weights bundle for its files (:mod:`.packed_cache`)."""
    if requested is None and _declared_method(hf_config) not in DECLARED_METHODS:
        return None  # the common case, answered before importing the config classes
    from .detection import attach_load_cache, detect_packed

    config = detect_packed(hf_config, requested, options.quantization_options)
    if config is not None:
        attach_load_cache(config, options.weight_files)
    return config


@hookimpl(wrapper=True)
def loader_process_weights_after_loading(model: nn.Module, quant_config: QuantizationConfig | None,
                                         target_device: torch.device) -> Generator[None, list[None], list[None]]:
    """A compressed-tensors checkpoint: its FP8 KV cache scales and online rotations reach their layers (before
    the layers are processed, as before). Once every layer succeeded: the load's packed-weights bundle is
    written when it packed kernels it did not find there; a failed load writes nothing."""
    if quant_config is not None and quant_config.name == "compressed-tensors":
        from .ct_post_load import finish_compressed_tensors_load

        finish_compressed_tensors_load(model, quant_config)
    try:
        result = yield
    finally:
        if quant_config is not None and quant_config.name in DECLARED_METHODS:
            from .deferred_parts import release_scratch

            release_scratch()
    if quant_config is not None and quant_config.name in DECLARED_METHODS:
        from .detection import finish_load_cache

        finish_load_cache(quant_config)
    return result
