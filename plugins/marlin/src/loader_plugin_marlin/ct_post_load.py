"""What a compressed-tensors load finishes once every weight is in: the model-wide pieces no layer method sees.

The FP8 KV cache scales go to the attention layers (:mod:`.kv_cache_scales`) and the online rotations to the
linear layers whose input they rotate (:mod:`.online_transforms`); both were taken out of the weight stream by
:meth:`~loader_plugin_marlin.compressed_tensors_config.CompressedTensorsConfig.wrap_weights`.
"""

from __future__ import annotations

from torch import nn

from loader.layers import QuantizationConfig

from .compressed_tensors_config import CompressedTensorsConfig
from .kv_cache_scales import attach_kv_cache_scales
from .online_transforms import attach_online_transforms

__all__ = ["finish_compressed_tensors_load"]


def finish_compressed_tensors_load(model: nn.Module, quant_config: QuantizationConfig) -> None:
    """Attach the declared KV cache scales and online rotations; record where, for the load report."""
    if not isinstance(quant_config, CompressedTensorsConfig):
        return
    if quant_config.kv_cache_scheme is not None:
        quant_config.kv_attached[:] = attach_kv_cache_scales(model, quant_config.kv_scales)
    if quant_config.transforms:
        quant_config.rotated[:] = attach_online_transforms(model, quant_config.transforms,
                                                           quant_config.transform_matrices,
                                                           quant_config.packed_modules)
        quant_config.transform_matrices.clear()  # each layer's hook holds its scaled float32 copy
