"""Public: TP-aware building blocks shared by model and quantization plugins.

The parallel layers, the parameter layouts and weight loaders, and the
quantization bases (:class:`QuantizationConfig` and its methods); the CPU
kernels quantize methods pack for are :mod:`loader.kernels`. Plugins
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
    from .expert_placement import ExpertPlacement, place_experts
    from .fused_moe import ExpertNames, ExpertTarget, FusedMoE
    from .layernorm import RMSNorm
    from .linear import (
        ColumnParallelLinear,
        LinearBase,
        MergedColumnParallelLinear,
        QKVParallelLinear,
        ReplicatedLinear,
        RowParallelLinear,
    )
    from .moe_block import GatedMLP, SparseMoeBlock
    from .moe_dispatch import ExpertForward, run_chosen_experts
    from .moe_method import ExpertsShape, FusedMoEMethodBase, UnquantizedFusedMoEMethod
    from .moe_router import TopKRouting, select_experts
    from .moe_settings import MoESettings
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
    "ExpertForward",
    "ExpertNames",
    "ExpertPlacement",
    "ExpertTarget",
    "ExpertsShape",
    "FusedMoE",
    "FusedMoEMethodBase",
    "GatedMLP",
    "KVCache",
    "LinearBase",
    "LinearMethodBase",
    "LinearShape",
    "MergedColumnParallelLinear",
    "MoESettings",
    "NarrowedPart",
    "OutputPart",
    "ParallelLMHead",
    "ParamLayout",
    "PartLoader",
    "QKVParallelLinear",
    "QuantizationConfig",
    "QuantizeMethodBase",
    "RMSNorm",
    "ROPE_SCALING_FIELDS",
    "ReplicatedLinear",
    "RotaryEmbedding",
    "RowParallelLinear",
    "ShardId",
    "SiluAndMul",
    "SparseMoeBlock",
    "TopKRouting",
    "UnquantizedFusedMoEMethod",
    "UnquantizedLinearMethod",
    "VocabParallelEmbedding",
    "WeightLoader",
    "default_weight_loader",
    "get_rope",
    "layout_of",
    "param_shape",
    "place_experts",
    "run_chosen_experts",
    "select_experts",
    "set_param_layout",
    "weight_loader_of",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "SiluAndMul": ".activation",
    "Attention": ".attention",
    "KVCache": ".attention",
    "default_weight_loader": ".default_loader",
    "RMSNorm": ".layernorm",
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
    "ExpertPlacement": ".expert_placement",
    "place_experts": ".expert_placement",
    "ExpertNames": ".fused_moe",
    "ExpertTarget": ".fused_moe",
    "FusedMoE": ".fused_moe",
    "GatedMLP": ".moe_block",
    "MoESettings": ".moe_settings",
    "SparseMoeBlock": ".moe_block",
    "ExpertForward": ".moe_dispatch",
    "run_chosen_experts": ".moe_dispatch",
    "ExpertsShape": ".moe_method",
    "FusedMoEMethodBase": ".moe_method",
    "UnquantizedFusedMoEMethod": ".moe_method",
    "TopKRouting": ".moe_router",
    "select_experts": ".moe_router",
    "ReplicatedLinear": ".linear",
})
