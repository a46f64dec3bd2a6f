"""Public: TP-aware building blocks shared by model and quantization plugins.

The parallel layers, the parameter layouts and weight loaders, and the
quantization bases (:class:`QuantizationConfig` and its methods). Plugins
import these names from ``loader.layers``; its submodules are internal.
Names are imported on first access (PEP 562), so ``from loader.layers import
QuantizationConfig`` in a plugin's light entry-point module does not pull in
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .activation import SiluAndMul
    from .attention import Attention, KVCache
    from .default_loader import default_weight_loader
    from .int4_cpu import (
        KERNEL_GROUP_SIZES,
        Int4CpuWeight,
        int4_unsupported_reason,
        pack_int4,
        pack_int4_half_split,
        pack_int4_half_split_parts,
        packed_layout_fingerprint,
    )
    from .int8_cpu import Int8GroupedWeight, int8_grouped_unsupported_reason, pack_int8_grouped
    from .layernorm import RMSNorm
    from .linear import (
        ColumnParallelLinear,
        LinearBase,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from .native_packing import NativeRepack, native_repack, native_repack_unavailable_reason
    from .param_layout import ParamLayout, PartLoader, layout_of, param_shape, set_param_layout, weight_loader_of
    from .quantization import (
        EmbeddingMethodBase,
        EmbeddingShape,
        LinearMethodBase,
        LinearShape,
        QuantizationConfig,
        QuantizeMethodBase,
        UnquantizedLinearMethod,
        WeightLoader,
    )
    from .rotary_embedding import ROPE_SCALING_FIELDS, RotaryEmbedding, get_rope
    from .shard_loading import NarrowedPart, OutputPart, ShardId
    from .vocab_embedding import ParallelLMHead, VocabParallelEmbedding

__all__ = [
    "Attention",
    "ColumnParallelLinear",
    "EmbeddingMethodBase",
    "EmbeddingShape",
    "Int4CpuWeight",
    "Int8GroupedWeight",
    "KERNEL_GROUP_SIZES",
    "KVCache",
    "LinearBase",
    "LinearMethodBase",
    "LinearShape",
    "MergedColumnParallelLinear",
    "NarrowedPart",
    "NativeRepack",
    "OutputPart",
    "ParallelLMHead",
    "ParamLayout",
    "PartLoader",
    "QKVParallelLinear",
    "QuantizationConfig",
    "QuantizeMethodBase",
    "RMSNorm",
    "ROPE_SCALING_FIELDS",
    "RotaryEmbedding",
    "RowParallelLinear",
    "ShardId",
    "SiluAndMul",
    "UnquantizedLinearMethod",
    "VocabParallelEmbedding",
    "WeightLoader",
    "default_weight_loader",
    "get_rope",
    "int4_unsupported_reason",
    "int8_grouped_unsupported_reason",
    "layout_of",
    "native_repack",
    "native_repack_unavailable_reason",
    "pack_int4",
    "pack_int4_half_split",
    "pack_int4_half_split_parts",
    "pack_int8_grouped",
    "packed_layout_fingerprint",
    "param_shape",
    "set_param_layout",
    "weight_loader_of",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "SiluAndMul": ".activation",
    "Attention": ".attention",
    "KVCache": ".attention",
    "default_weight_loader": ".default_loader",
    "RMSNorm": ".layernorm",
    "Int4CpuWeight": ".int4_cpu",
    "KERNEL_GROUP_SIZES": ".int4_cpu",
    "int4_unsupported_reason": ".int4_cpu",
    "pack_int4": ".int4_cpu",
    "pack_int4_half_split": ".int4_cpu",
    "pack_int4_half_split_parts": ".int4_cpu",
    "packed_layout_fingerprint": ".int4_cpu",
    "Int8GroupedWeight": ".int8_cpu",
    "int8_grouped_unsupported_reason": ".int8_cpu",
    "pack_int8_grouped": ".int8_cpu",
    "NativeRepack": ".native_packing",
    "native_repack": ".native_packing",
    "native_repack_unavailable_reason": ".native_packing",
    "ColumnParallelLinear": ".linear",
    "LinearBase": ".linear",
    "MergedColumnParallelLinear": ".linear",
    "QKVParallelLinear": ".linear",
    "RowParallelLinear": ".linear",
    "ParamLayout": ".param_layout",
    "PartLoader": ".param_layout",
    "layout_of": ".param_layout",
    "param_shape": ".param_layout",
    "set_param_layout": ".param_layout",
    "weight_loader_of": ".param_layout",
    "EmbeddingMethodBase": ".quantization",
    "EmbeddingShape": ".quantization",
    "LinearMethodBase": ".quantization",
    "LinearShape": ".quantization",
    "QuantizationConfig": ".quantization",
    "QuantizeMethodBase": ".quantization",
    "UnquantizedLinearMethod": ".quantization",
    "WeightLoader": ".quantization",
    "RotaryEmbedding": ".rotary_embedding",
    "get_rope": ".rotary_embedding",
    "ROPE_SCALING_FIELDS": ".rotary_embedding",
    "NarrowedPart": ".shard_loading",
    "OutputPart": ".shard_loading",
    "ShardId": ".shard_loading",
    "ParallelLMHead": ".vocab_embedding",
    "VocabParallelEmbedding": ".vocab_embedding",
})
