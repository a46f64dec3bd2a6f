"""A packed GGUF linear layer's parts turned into what it keeps: torch's int4 layout (Q4 blocks as they are, Q8_0
as two planes), from the packed-weights bundle when an earlier load wrote it, or a dense weight.

The parts come in row order (a fused layer's ``q``/``k``/``v`` or ``gate``/``up``) and are never concatenated
as blocks: Q4_0/Q4_1 are packed straight from their nibbles (:mod:`.half_split`), each part's scales written
into the layer's in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from loader.kernels import (
    Int4CpuWeight,
    Int8GroupedWeight,
    PathWeight,
    TokenPlan,
    pack_int4,
    pack_int8_grouped,
    plan_weight_paths,
)
from loader.weights import CheckpointTensor

from .bundle_keys import unit_key
from .half_split import pack_int4_half_split_parts
from .options import dtype_name
from .plan import int4_packed_bytes
from .q4_blocks import GROUP_SIZE, HALF_SPLIT_TYPES, affine_rows, half_split_rows, int8_rows
from .q4_k_packing import pack_q4_k_parts

if TYPE_CHECKING:
    from torch import nn

    from .config import GGUFQuantConfig

__all__ = ["current_packed", "dense_weight", "keep_packed", "kernel_weight", "pack_int4_parts", "pack_int8_parts",
           "packed_bytes", "packed_weight", "plan_paths"]

_HALF_SPLIT_NAMES = tuple(t.name for t in HALF_SPLIT_TYPES)


def pack_int4_parts(parts: list[CheckpointTensor], dtype: torch.dtype) -> Int4CpuWeight:
    """The layer's parts (in row order) in torch's int4 layout; Q4_0/Q4_1 without unpacking their nibbles, Q4_K
    by the compiled helpers when they take it (:mod:`.q4_k_packing`)."""
    if all(p.stored_type in _HALF_SPLIT_NAMES for p in parts):
        split = [half_split_rows(p) for p in parts]
        groups = int(split[0].qs.shape[1])
        scales_and_zeros = torch.empty(groups, sum(h.rows for h in split), 2, dtype=dtype)
        start = 0
        for h in split:  # each part's fields straight into the layer's scales, in the kernel's dtype
            h.scales_and_zeros_into(scales_and_zeros, start)
            start += h.rows
        # rows in llama.cpp's q/k order are read where they lie, not copied out first
        return pack_int4_half_split_parts([h.qs for h in split], scales_and_zeros, [h.order for h in split])
    compiled = pack_q4_k_parts(parts, dtype) if all(p.stored_type == "Q4_K" for p in parts) else None
    if compiled is not None:
        return compiled
    decoded = [affine_rows(p) for p in parts]
    codes = torch.cat([d.codes for d in decoded])
    scales = torch.cat([d.scales for d in decoded], dim=1)
    biases = torch.cat([d.biases for d in decoded], dim=1)
    return pack_int4(codes, scales, biases, GROUP_SIZE, dtype)


def pack_int8_parts(parts: list[CheckpointTensor], dtype: torch.dtype) -> Int8GroupedWeight:
    """Q8_0 parts (in row order) as the two int4 planes of their codes; one part packs from the file's view."""
    decoded = [int8_rows(p) for p in parts]
    codes = decoded[0].codes if len(decoded) == 1 else torch.cat([d.codes for d in decoded])
    scales = decoded[0].scales if len(decoded) == 1 else torch.cat([d.scales for d in decoded], dim=1)
    return pack_int8_grouped(codes, scales, dtype)


def packed_weight(config: GGUFQuantConfig, kernel: str, tensors: list[CheckpointTensor],
                  dtype: torch.dtype) -> Int4CpuWeight:
    """``tensors`` (in row order) in torch's int4 layout: Q4 blocks as they are, Q8_0 as its two planes;
    from the packed-weights bundle when an earlier load wrote it (:meth:`~.config.GGUFQuantConfig.cached_unit`)."""
    made: list[Int4CpuWeight] = []

    def build() -> dict[str, torch.Tensor] | None:
        packed = pack_int8_parts(tensors, dtype).planes if kernel == "int4x2" else pack_int4_parts(tensors, dtype)
        made.append(packed)
        # an unpacked weight carries its reason, which the bundle does not hold (the kernel took the shape)
        return {"data": packed.data, "scales_and_zeros": packed.scales_and_zeros} if packed.packed else None

    rows = sum(int(tensor.shape[0]) for tensor in tensors) * (2 if kernel == "int4x2" else 1)
    cols = int(tensors[0].shape[-1])
    expected = {"data": (torch.uint8, (rows, cols // 2)),
                "scales_and_zeros": (dtype, (cols // GROUP_SIZE, rows, 2))}
    unit = config.cached_unit(unit_key(kernel, dtype, tensors, config.files), build, expected)
    if made:
        return made[0]
    assert unit is not None
    sz = unit["scales_and_zeros"]
    return Int4CpuWeight(unit["data"], sz, GROUP_SIZE, int(sz.shape[0]) * GROUP_SIZE)


def keep_packed(layer: nn.Module, prefix: str, packed: Int4CpuWeight) -> int:
    """Register ``{prefix}packed_weight`` and ``{prefix}packed_scales_and_zeros``; their bytes."""
    layer.register_buffer(f"{prefix}packed_weight", packed.data)
    layer.register_buffer(f"{prefix}packed_scales_and_zeros", packed.scales_and_zeros)
    sz = packed.scales_and_zeros
    return packed.data.numel() + sz.numel() * sz.element_size()


def dense_weight(tensors: list[CheckpointTensor], shape: tuple[int, int], dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor:
    """``tensors`` (in row order, as :func:`pack_int4_parts` takes them) dequantized into one ``shape`` weight."""
    dense = torch.empty(*shape, dtype=dtype, device=device)
    at = 0
    for tensor in tensors:
        rows = int(tensor.shape[0])
        dense[at:at + rows].copy_(tensor.read(dtype))
        at += rows
    return dense


def kernel_weight(kernel: str, packed: Int4CpuWeight) -> Int4CpuWeight | Int8GroupedWeight:
    """What ``kernel`` multiplies by: the int4 weight itself, or for ``int4x2`` the planes as int8 rows."""
    return Int8GroupedWeight(packed, int(packed.data.shape[0]) // 2) if kernel == "int4x2" else packed


def packed_bytes(kernel: str, rows: int, cols: int, dtype: torch.dtype) -> int:
    """What :func:`keep_packed` will hold, from the shape alone (the ``int4x2`` planes: twice the rows)."""
    return int4_packed_bytes(2 * rows if kernel == "int4x2" else rows, cols, dtype)


def current_packed(layer: nn.Module, prefix: str, cached: Int4CpuWeight | None) -> Int4CpuWeight:
    """The int4 weight over ``layer``'s current ``{prefix}packed_*`` buffers: ``cached`` while it still wraps
    them, else a new wrapper (a ``module.to`` replaces buffers; a decode step asks on every call)."""
    data, scales_and_zeros = packed_buffers(layer, prefix)
    if cached is None or cached.data is not data or cached.scales_and_zeros is not scales_and_zeros:
        # every input column the kernel reads: the layer's own, or all of them for a row window
        cached = Int4CpuWeight(data, scales_and_zeros, GROUP_SIZE, int(scales_and_zeros.shape[0]) * GROUP_SIZE)
    return cached


def packed_buffers(layer: nn.Module, prefix: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's current ``{prefix}packed_weight`` and ``{prefix}packed_scales_and_zeros`` (read from the
    buffer dict, not ``Module.__getattr__``: a decode call reads them every time)."""
    buffers = layer._buffers
    return (cast(torch.Tensor, buffers[f"{prefix}packed_weight"]),
            cast(torch.Tensor, buffers[f"{prefix}packed_scales_and_zeros"]))


def plan_paths(weight: PathWeight, kind: str, kernel_dtype: torch.dtype, activations: torch.dtype) -> TokenPlan:
    """A packed weight's path per token count for ``activations`` (timed once per ``kind`` and shape on this
    machine): the kernel or its dequantized twin; a float32 kernel (``kernel_dtype="float32"``) keeps only
    float32 arithmetic. Linear layers, their segments, experts and heads all plan here."""
    return plan_weight_paths(weight, f"gguf:{kind}:{dtype_name(kernel_dtype)}", activations,
                             exact=kernel_dtype == torch.float32)
