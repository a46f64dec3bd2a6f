"""A compressed-tensors checkpoint's FP8 KV cache scales, put on the attention layers they were calibrated for.

``kv_cache_scheme`` checkpoints carry ``<attention>.k_scale`` and ``<attention>.v_scale`` (per-tensor FP8
scales). :class:`~loader_plugin_marlin.compressed_tensors_config.CompressedTensorsConfig` takes them out of the
weight stream (no model plugin has parameters for them); once the model is loaded, each pair goes to the one
:class:`~loader.layers.Attention` under its prefix (``model.layers.0.self_attn`` holds ``...self_attn.attn``),
which then rounds keys and values as the FP8 cache the checkpoint was calibrated with does. Every attention
layer must get its pair and every pair its layer: a checkpoint that does not say how to round a layer's cache,
or names a layer the model lacks, is refused by name.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from loader.errors import CheckpointFormatError
from loader.layers import Attention

__all__ = ["attach_kv_cache_scales"]


def _pairs(scales: Mapping[str, float]) -> dict[str, dict[str, float]]:
    pairs: dict[str, dict[str, float]] = {}
    for name, value in scales.items():
        prefix, _, leaf = name.rpartition(".")
        pairs.setdefault(prefix, {})[leaf] = value
    return pairs


def attach_kv_cache_scales(model: nn.Module, scales: Mapping[str, float]) -> list[str]:
    """Give each attention layer of ``model`` its ``k_scale``/``v_scale``; return the layers given them."""
    attentions = {name: module for name, module in model.named_modules() if isinstance(module, Attention)}
    given: dict[str, tuple[float, float]] = {}
    for prefix, pair in sorted(_pairs(scales).items()):
        under = [name for name in attentions if name.startswith(f"{prefix}.")]
        if len(under) != 1:
            raise CheckpointFormatError(f"tensor '{prefix}.k_scale' (FP8 KV cache): the model has "
                                        f"{len(under) or 'no'} attention layer(s) under {prefix!r}")
        missing = sorted({"k_scale", "v_scale"} - set(pair))
        if missing:
            raise CheckpointFormatError(f"FP8 KV cache of {prefix!r}: the checkpoint has no {prefix}.{missing[0]}")
        given[under[0]] = (pair["k_scale"], pair["v_scale"])
    without = sorted(set(attentions) - set(given))
    if without:
        raise CheckpointFormatError(f"config.json quantization_config declares kv_cache_scheme, but the checkpoint "
                                    f"has no k_scale/v_scale for attention layer(s) {', '.join(without[:4])}")
    for name, (k_scale, v_scale) in given.items():
        attentions[name].set_kv_cache_scales(k_scale, v_scale)
    return sorted(given)

