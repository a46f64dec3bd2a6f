"""A wide 4-bit layer converted for torch's int4 CPU kernel a slice of output columns at a time.

Why: converting a layer whole unpacks every code to a byte first (the
internal :class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`),
then builds torch's layout from it: about two bytes of short-lived memory per
weight on top of the checkpoint's half byte and the result's. Post-processing
runs after every tensor is in, so that transient adds straight to the load's
peak RSS; for an untied 32000-word GPTQ ``lm_head`` over 2048 inputs it was
~125 MiB, more than the whole quantized head. torch's layout is a
concatenation of independent 64-row blocks of output features (32 on AVX2),
and every format's tensors split into whole int32 words along the output
dim, so slices of :data:`COLUMN_CHUNK` columns convert to the same bytes.

Only the int4 kernel is built this way; a layer any slice of which would get
another kernel (8-bit, a shape the kernel refuses, a CUDA device, a forced
``dequantize``) is converted whole by :func:`~loader_plugin_marlin.kernels.choose_kernel`.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch

from loader.kernels import Int4CpuWeight

from .kernels import Int4Kernel, choose_kernel
from .layer_geometry import LayerGeometry
from .param_specs import CheckpointLayout, ParamSpec

__all__ = ["COLUMN_CHUNK", "int4_by_columns"]

COLUMN_CHUNK = 4096
"""Output columns per slice: a multiple of 64 (torch's row blocks, and whole int32 words of 4-bit values); the
transient per slice is then ~8 MiB per 1024 input features."""

_N_MULTIPLE = 16  # the int4 kernel's requirement on output features


def _columns(tensor: torch.Tensor, spec: ParamSpec, start: int, width: int) -> torch.Tensor:
    """Output columns ``[start, start + width)`` of one checkpoint tensor (a view; packed dims in words)."""
    if spec.output_dim is None:
        return tensor
    pack = spec.pack_factor if spec.packed_dim == spec.output_dim else 1
    return tensor.narrow(spec.output_dim, start // pack, width // pack)


def int4_by_columns(layout: CheckpointLayout, geometry: LayerGeometry, tensors: Mapping[str, torch.Tensor], *,
                    bits: int, requested: str, dtype: torch.dtype) -> Int4Kernel | None:
    """The layer's int4 kernel built slice by slice, or ``None`` when the layer is not converted this way.

    ``None`` for layers no wider than one slice, other than 4-bit, off the
    CPU, or whose first slice gets another kernel; the caller then converts
    the layer whole (which also produces the fallback's reason). Values are
    checked as in a whole conversion: each slice goes through the format's
    ``to_quantized`` (``g_idx`` once per slice).
    """
    cols = geometry.cols
    if bits != 4 or requested not in ("auto", "int4pack") or cols <= COLUMN_CHUNK or cols % _N_MULTIPLE:
        return None
    if any(t.device.type != "cpu" for t in tensors.values()):
        return None
    specs = {spec.name: spec for spec in layout.params(geometry)}
    first: Int4Kernel | None = None
    data = torch.empty(0, dtype=torch.uint8)
    scales_and_zeros: list[torch.Tensor] = []
    for start in range(0, cols, COLUMN_CHUNK):
        width = min(COLUMN_CHUNK, cols - start)
        part = {name: _columns(tensor, specs[name], start, width) for name, tensor in tensors.items()}
        kernel = choose_kernel(layout.to_quantized(part, geometry), requested, dtype)
        if not isinstance(kernel, Int4Kernel):
            return None  # the whole-layer conversion decides (and says why)
        if first is None:
            first = kernel
            data = torch.empty((cols, *kernel.packed.data.shape[1:]), dtype=kernel.packed.data.dtype)
        data[start:start + width].copy_(kernel.packed.data)
        scales_and_zeros.append(kernel.packed.scales_and_zeros)
        del kernel, part
    assert first is not None
    packed = Int4CpuWeight(data, torch.cat(scales_and_zeros, dim=1), first.packed.group_size,
                           first.packed.in_features, None)
    return attrs.evolve(first, packed=packed)
