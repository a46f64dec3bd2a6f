"""Public: the CPU kernels quantization plugins pack weights for, and the record of which one each layer runs.

- Choosing: :class:`KernelChoice` (which kernel, why, from what: a layer's load-report record and its
  ``layer_plan``) made by :func:`choose_kernel` from a method's :class:`KernelOption`\\ s.
- torch's packed int4 CPU matmul for any affine 4-bit weight: :func:`pack_int4` / :func:`pack_int4_codes` ->
  :class:`Int4CpuWeight`, with :func:`int4_unsupported_reason` and :data:`KERNEL_GROUP_SIZES`.
- int8 weights: channelwise on torch's int8 kernel (:func:`pack_int8` -> :class:`Int8CpuWeight`,
  :func:`int8_unsupported_reason`), a scale per 32 columns as two int4 planes (:func:`pack_int8_grouped` ->
  :class:`Int8GroupedWeight`, :func:`int8_grouped_unsupported_reason`).
- The compiled packing helpers (:func:`native_repack`, built on first use with ``$CC``; torch writes the same
  bytes without them) and :func:`packed_layout_fingerprint`, a digest of what decides packed bytes.
- Per call, which path a kept weight runs (:mod:`~loader.kernels.token_plan`: ``packed``, ``packed-bf16``,
  ``dequantize``, ``dense``) by activation dtype and tokens: a :class:`TokenPlan` from timings measured on this
  machine once and cached (:func:`plan_weight_paths`), or the static rule (:func:`static_plan`); the weight
  runs it with :func:`run_planned` / :func:`run_path`.
- The packed-weights bundle (:class:`PackedBundle`): what a quantize method packed, kept on disk and mapped
  copy-on-write by the next load of the same files (:func:`source_identity`, :func:`packing_salt` name it);
  :class:`LoadBundle`, one load's use of it (opened by the first layer that asks, written once every layer
  succeeded, then let go).

Plugins import these names from ``loader.kernels``; its submodules are internal. Names are imported on first
access (:func:`loader.lazy.lazy_exports`), so naming :class:`KernelChoice` in a light module does not pull in
torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import lazy_exports

if TYPE_CHECKING:
    from .bundle import PackedBundle, packing_salt, source_identity
    from .choice import KernelChoice, KernelOption, choose_kernel
    from .fingerprint import packed_layout_fingerprint
    from .int4_cpu import (
        KERNEL_GROUP_SIZES,
        Int4CpuWeight,
        int4_scales_and_zeros,
        int4_unsupported_reason,
        pack_int4,
        pack_int4_codes,
    )
    from .int4_layout import torch_int4_block_n
    from .int8_cpu import (
        Int8CpuWeight,
        Int8GroupedWeight,
        int8_grouped_unsupported_reason,
        int8_unsupported_reason,
        pack_int8,
        pack_int8_grouped,
    )
    from .kernel_timing import measure_paths, measured_plan
    from .load_bundle import LoadBundle
    from .native_packing import NativeRepack, native_repack, native_repack_unavailable_reason
    from .token_plan import (
        DENSE,
        DEQUANTIZE,
        PACKED,
        PACKED_BF16,
        TOKEN_BUCKETS,
        TokenPlan,
        bucket_label,
        plan_from_timings,
        static_plan,
        token_bucket,
    )
    from .weight_paths import (
        MEASURE_MAX_WEIGHTS,
        PACKED_BF16_LOGITS_TOLERANCE,
        PathWeight,
        available_paths,
        dense_budget,
        dequantize_tile_rows,
        exact_float32_default,
        measure_rows,
        paths_from_shapes,
        plan_weight_paths,
        run_path,
        run_planned,
    )

__all__ = [
    "DENSE",
    "DEQUANTIZE",
    "PACKED",
    "PACKED_BF16",
    "MEASURE_MAX_WEIGHTS",
    "PACKED_BF16_LOGITS_TOLERANCE",
    "TOKEN_BUCKETS",
    "PathWeight",
    "TokenPlan",
    "available_paths",
    "bucket_label",
    "dense_budget",
    "dequantize_tile_rows",
    "exact_float32_default",
    "measure_rows",
    "measure_paths",
    "measured_plan",
    "paths_from_shapes",
    "plan_from_timings",
    "plan_weight_paths",
    "run_path",
    "run_planned",
    "static_plan",
    "token_bucket",
    "Int4CpuWeight",
    "Int8CpuWeight",
    "Int8GroupedWeight",
    "KERNEL_GROUP_SIZES",
    "KernelChoice",
    "KernelOption",
    "LoadBundle",
    "NativeRepack",
    "PackedBundle",
    "choose_kernel",
    "int4_scales_and_zeros",
    "int4_unsupported_reason",
    "int8_grouped_unsupported_reason",
    "int8_unsupported_reason",
    "native_repack",
    "native_repack_unavailable_reason",
    "pack_int4",
    "pack_int4_codes",
    "pack_int8",
    "pack_int8_grouped",
    "packed_layout_fingerprint",
    "packing_salt",
    "source_identity",
    "torch_int4_block_n",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "PackedBundle": ".bundle",
    "packing_salt": ".bundle",
    "source_identity": ".bundle",
    "LoadBundle": ".load_bundle",
    "KernelChoice": ".choice",
    "KernelOption": ".choice",
    "choose_kernel": ".choice",
    "packed_layout_fingerprint": ".fingerprint",
    "Int4CpuWeight": ".int4_cpu",
    "KERNEL_GROUP_SIZES": ".int4_cpu",
    "int4_scales_and_zeros": ".int4_cpu",
    "int4_unsupported_reason": ".int4_cpu",
    "pack_int4": ".int4_cpu",
    "pack_int4_codes": ".int4_cpu",
    "torch_int4_block_n": ".int4_layout",
    "Int8CpuWeight": ".int8_cpu",
    "Int8GroupedWeight": ".int8_cpu",
    "int8_grouped_unsupported_reason": ".int8_cpu",
    "int8_unsupported_reason": ".int8_cpu",
    "pack_int8": ".int8_cpu",
    "pack_int8_grouped": ".int8_cpu",
    "measure_paths": ".kernel_timing",
    "measured_plan": ".kernel_timing",
    "DENSE": ".token_plan",
    "DEQUANTIZE": ".token_plan",
    "PACKED": ".token_plan",
    "PACKED_BF16": ".token_plan",
    "TOKEN_BUCKETS": ".token_plan",
    "TokenPlan": ".token_plan",
    "bucket_label": ".token_plan",
    "plan_from_timings": ".token_plan",
    "static_plan": ".token_plan",
    "token_bucket": ".token_plan",
    "MEASURE_MAX_WEIGHTS": ".weight_paths",
    "PACKED_BF16_LOGITS_TOLERANCE": ".weight_paths",
    "PathWeight": ".weight_paths",
    "available_paths": ".weight_paths",
    "dense_budget": ".weight_paths",
    "dequantize_tile_rows": ".weight_paths",
    "exact_float32_default": ".weight_paths",
    "measure_rows": ".weight_paths",
    "paths_from_shapes": ".weight_paths",
    "plan_weight_paths": ".weight_paths",
    "run_path": ".weight_paths",
    "run_planned": ".weight_paths",
    "NativeRepack": ".native_packing",
    "native_repack": ".native_packing",
    "native_repack_unavailable_reason": ".native_packing",
})
