"""A 4-bit layer's int32 words packed straight into torch's int4 CPU layout by the core's compiled helper.

Why: the general conversion (:func:`~loader_plugin_marlin.layer_kernels.build_kernel`) unpacks every code to a
byte first (the internal :class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`) and then builds torch's
layout from those bytes: two passes over memory, and a byte per weight of fresh memory between them, which were
most of a GPTQ load's post-processing. :meth:`loader.kernels.NativeRepack.int4pack_words` reads the checkpoint's
words once and writes torch's layout, each code unpacked in registers; the scales and zero points (a
``1 / group_size`` share of the weight) are converted by the formats' own code, as in the general conversion.

Which layers: 4-bit GPTQ, AWQ and compressed-tensors ``pack-quantized`` layers on the CPU whose kernel is
``auto`` or ``int4pack``, without act-order, whose groups the int4 kernel takes as they are. Every other layer,
and every layer when the compiled helpers cannot be had (:func:`loader.kernels.native_repack` is ``None``), is
converted by the general path, which writes the same bytes (the tests compare the two, layer by layer).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from loader.kernels import (
    Int4CpuWeight,
    KernelChoice,
    int4_scales_and_zeros,
    int4_unsupported_reason,
    native_repack,
    torch_int4_block_n,
)

from .kernel_paths import kernel_dtype_for, with_paths
from .kernels import Int4Kernel, LayerKernel, kernel_group
from .layer_geometry import LayerGeometry
from .layer_kernels import build_kernel
from .packed_words import WordPackedLayout

if TYPE_CHECKING:
    from .config import PackedQuantConfig

__all__ = ["int4_from_words", "layer_kernel", "word_tensor"]


def word_tensor(config: PackedQuantConfig) -> str | None:
    """The checkpoint tensor holding the layer's code words, which every conversion reads and none keeps
    (``None`` for a format packed otherwise)."""
    layout = config.layout
    return layout.word_tensor if isinstance(layout, WordPackedLayout) else None


def int4_from_words(config: PackedQuantConfig, geometry: LayerGeometry, tensors: Mapping[str, torch.Tensor],
                    dtype: torch.dtype) -> Int4Kernel | None:
    """The layer's int4 kernel (scales in the kernel dtype ``dtype``, no path plan yet) packed from its words
    by the compiled helper, or ``None`` when the layer is not one this path takes (the general conversion then
    runs, and says why a layer falls back)."""
    layout = config.layout
    if config.bits != 4 or config.kernel not in ("auto", "int4pack") or config.act_order:
        return None
    if not isinstance(layout, WordPackedLayout) or any(t.device.type != "cpu" for t in tensors.values()):
        return None
    helpers, block_n = native_repack(), torch_int4_block_n()
    if helpers is None or block_n is None:
        return None
    words = layout.packed_words(tensors, geometry)
    k, n = geometry.rows, geometry.cols
    size = kernel_group(words.g_idx)
    if size is None or int4_unsupported_reason(n, k, size) is not None:
        return None
    block_groups = words.g_idx[::size].long()
    scales = words.scales[block_groups]
    biases = -words.zeros[block_groups].to(torch.float32) * scales
    data = torch.empty(n, k // 2, dtype=torch.uint8)
    helpers.int4pack_words(words.words, words.along, words.shifts, block_n, data)
    packed = Int4CpuWeight(data, int4_scales_and_zeros(scales, biases, dtype), size, k, None)
    return Int4Kernel(packed, None, KernelChoice("int4pack", None), False)


def layer_kernel(config: PackedQuantConfig, geometry: LayerGeometry, tensors: Mapping[str, torch.Tensor],
                 dtype: torch.dtype) -> LayerKernel:
    """The kernel of one weight from its checkpoint tensors: packed from the words when :func:`int4_from_words`
    takes the layer, else by :func:`~loader_plugin_marlin.layer_kernels.build_kernel` (the same bytes, the same
    kernel dtype for the load's ``dtype`` and the same path per token count)."""
    direct = int4_from_words(config, geometry, tensors, kernel_dtype_for(dtype, config.exact_float32))
    if direct is None:
        return build_kernel(config, geometry, tensors, dtype)
    return with_paths(direct, dtype, exact=config.exact_float32, budget=config.dense_budget)
