"""What an FP8 checkpoint stores per linear layer, how this rank's share of it is laid out, and its weight.

Three producers write the same idea in different words: an ``float8_e4m3fn``
``weight [N, K]`` and float32 scales such that ``W = fp8 * scale``.

* ``quant_method: "fp8"`` (DeepSeek-V3, Qwen3-FP8; transformers' FineGrainedFP8):
  ``weight_scale_inv`` ``[ceil(N/bn), ceil(K/bk)]``, one scale per block of the
  ``weight_block_size`` ``[bn, bk]``; the last block of a dimension may be
  partial (DeepSeek-V3's 576-row ``kv_a_proj_with_mqa`` has 4.5 blocks). With
  ``weight_block_size: null`` a scalar ``weight_scale_inv`` covers the tensor.
* ``quant_method: "fbgemm_fp8"``: ``weight_scale`` ``[N, 1]``, one per output row.
* compressed-tensors ``float-quantized``: ``weight_scale`` of strategy ``tensor``
  (``[1]`` or a scalar), ``channel`` (``[N, 1]``) or ``block`` (the same ceil grid:
  compressed-tensors 0.20 pads the weight to whole blocks when it quantizes, rows
  always, columns with a warning), and ``input_scale`` ``[1]`` for static activations.

Fused layers keep each part's scales: a per-tensor scale becomes one entry per
part (q, k, v), channel scales stack as rows, block scales as rows of blocks —
so a part boundary, or a tensor-parallel shard edge, inside a block is refused
by name (:func:`fp8_geometry`). Row-parallel layers split the input in whole blocks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import attrs
import torch

from loader.errors import UnsupportedError

if TYPE_CHECKING:
    from loader.layers import LinearBase, LinearShape

__all__ = ["FP8_DTYPE", "FP8_MAX", "WEIGHT_STRATEGIES", "ActivationQuant", "Fp8Geometry", "Fp8ParamSpec", "Fp8PartRows",
           "Fp8Scheme", "dequantize_weight", "fp8_geometry", "fp8_param_specs", "row_scales"]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)
"""448: the largest finite ``e4m3fn`` value, the range every producer scales into."""

WEIGHT_STRATEGIES = ("tensor", "channel", "block")


@attrs.frozen
class ActivationQuant:
    """How the checkpoint's producer quantized a layer's input to FP8 at inference.

    :ivar strategy: ``token`` (a scale per row), ``tensor`` (one scale) or ``group`` (per row, per
        ``group_size`` input columns).
    :ivar dynamic: scales computed from each input (``False``: the stored per-layer ``input_scale``).
    :ivar scale_ub: fbgemm's upper bound on a row's absolute maximum (``activation_scale_ub``).
    :ivar emulated_on_cpu: the CPU path quantizes and dequantizes the input exactly as the producer's own
        CPU reference does (compressed-tensors' decompressed forward); ``False`` where that reference keeps the
        input in full precision (transformers' dequantized FineGrainedFP8).
    """

    strategy: str
    dynamic: bool
    group_size: int | None = None
    scale_ub: float | None = None
    emulated_on_cpu: bool = True


@attrs.frozen
class Fp8Scheme:
    """One FP8 layout: the weight scales' strategy and name, and the activations' quantization.

    :ivar block: ``(rows, cols)`` of a block for strategy ``block``.
    :ivar scale_name: ``weight_scale_inv`` (``fp8``) or ``weight_scale``.
    """

    strategy: str
    scale_name: str = "weight_scale"
    block: tuple[int, int] | None = None
    activations: ActivationQuant | None = None

    @property
    def static_input(self) -> bool:
        """Whether each layer stores an ``input_scale`` (static per-tensor activations)."""
        return self.activations is not None and not self.activations.dynamic

    def describe(self) -> dict[str, object]:
        acts = self.activations
        return {"weights": self.strategy, "block": list(self.block) if self.block else None,
                "activations": None if acts is None else {
                    "strategy": acts.strategy, "dynamic": acts.dynamic, "group_size": acts.group_size,
                    "scale_ub": acts.scale_ub, "emulated_on_cpu": acts.emulated_on_cpu}}


@attrs.frozen
class Fp8PartRows:
    """One fused part's rows on this rank: ``start``/``length`` in the part's checkpoint tensor (``full`` rows),
    landing at ``offset`` of the layer's weight."""

    shard_id: object
    start: int
    length: int
    offset: int
    full: int


@attrs.frozen
class Fp8Geometry:
    """This rank's share of one layer: its parts' rows and its input columns.

    :ivar input_start: this rank's first input column (row-parallel layers split the input).
    """

    prefix: str
    parts: tuple[Fp8PartRows, ...]
    cols: int
    input_size: int
    input_start: int
    tp_size: int
    block: tuple[int, int] | None = None

    @property
    def rows(self) -> int:
        return sum(part.length for part in self.parts)

    def part(self, shard_id: object) -> Fp8PartRows:
        return next(part for part in self.parts if part.shard_id == shard_id)

    def part_index(self, shard_id: object) -> int:
        return [part.shard_id for part in self.parts].index(shard_id)

    @property
    def block_rows(self) -> int:
        """Rows of this rank's block-scale grid: each part's blocks from its block-aligned offset."""
        assert self.block is not None
        return max(part.offset // self.block[0] + math.ceil(part.length / self.block[0]) for part in self.parts)

    @property
    def block_cols(self) -> int:
        assert self.block is not None
        return math.ceil(self.cols / self.block[1])


def fp8_geometry(layer: LinearBase, shape: LinearShape, scheme: Fp8Scheme) -> Fp8Geometry:
    """This rank's share of ``layer``, checked against the scheme's blocks (see :func:`_check_blocks`)."""
    parts = []
    for shard_id in layer.shard_ids():
        found = layer.output_part(shard_id)
        parts.append(Fp8PartRows(shard_id, found.start, found.length, found.offset, found.full))
    cols = shape.input_size_per_partition
    split = cols != shape.input_size
    geometry = Fp8Geometry(prefix=layer.display_name, parts=tuple(parts), cols=cols, input_size=shape.input_size,
                           input_start=layer.tp_rank * cols if split else 0, tp_size=layer.tp_size,
                           block=scheme.block)
    if scheme.block is not None:
        _check_blocks(geometry, scheme.block)
    return geometry


def _check_blocks(geometry: Fp8Geometry, block: tuple[int, int]) -> None:
    """Refuse a layout whose parts or shards cut a block: one scale would have to serve two of them."""
    rows, cols = block
    where = f"{geometry.prefix}: FP8 weight blocks of {rows}x{cols}"
    for part in geometry.parts:
        if part.offset % rows:
            raise UnsupportedError(
                f"{where}: part {part.shard_id!r} starts at row {part.offset} of the fused weight, inside a "
                f"block; each fused part must hold whole blocks (part rows on this rank "
                f"{[p.length for p in geometry.parts]})")
        ends_part = part.start + part.length == part.full
        if part.start % rows or (part.length % rows and not ends_part):
            raise UnsupportedError(
                f"{where}: tensor parallel size {geometry.tp_size} gives this rank rows [{part.start}, "
                f"{part.start + part.length}) of part {part.shard_id!r} ({part.full} rows), which cuts a block; "
                f"each rank's rows must start and end on a multiple of {rows}")
    if geometry.cols != geometry.input_size and geometry.cols % cols:
        raise UnsupportedError(
            f"{where}: tensor parallel size {geometry.tp_size} gives each rank {geometry.cols} of "
            f"{geometry.input_size} input columns, which cuts a block; the columns per rank must be a multiple "
            f"of {cols}")


@attrs.frozen
class Fp8ParamSpec:
    """One checkpoint tensor of a layer as a parameter on this rank.

    :ivar role: ``weight`` (fp8 rows), ``part_scalar`` (one value per fused part: per-tensor weight
        scales, ``input_scale``), ``rows`` (a scale per output row) or ``blocks`` (the block grid).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    role: str


def fp8_param_specs(scheme: Fp8Scheme, geometry: Fp8Geometry) -> list[Fp8ParamSpec]:
    """The tensors one layer holds on this rank, named as in the checkpoint."""
    specs = [Fp8ParamSpec("weight", (geometry.rows, geometry.cols), FP8_DTYPE, "weight")]
    if scheme.strategy == "tensor":
        specs.append(Fp8ParamSpec(scheme.scale_name, (len(geometry.parts),), torch.float32, "part_scalar"))
    elif scheme.strategy == "channel":
        specs.append(Fp8ParamSpec(scheme.scale_name, (geometry.rows, 1), torch.float32, "rows"))
    else:
        specs.append(Fp8ParamSpec(scheme.scale_name, (geometry.block_rows, geometry.block_cols), torch.float32,
                                  "blocks"))
    if scheme.static_input:
        specs.append(Fp8ParamSpec("input_scale", (len(geometry.parts),), torch.float32, "part_scalar"))
    return specs


def row_scales(part_values: torch.Tensor, geometry: Fp8Geometry) -> torch.Tensor:
    """One value per fused part spread over that part's rows: ``[rows, 1]``."""
    lengths = torch.tensor([part.length for part in geometry.parts])
    return part_values.to(torch.float32).repeat_interleave(lengths).unsqueeze(1)


def dequantize_weight(weight: torch.Tensor, scale: torch.Tensor, scheme: Fp8Scheme, geometry: Fp8Geometry,
                      dtype: torch.dtype) -> torch.Tensor:
    """This rank's ``W = fp8 * scale`` in ``dtype``, computed in float32 (one rounding, to ``dtype``)."""
    values = weight.to(torch.float32)
    if scheme.strategy == "tensor":
        values.mul_(row_scales(scale, geometry))
    elif scheme.strategy == "channel":
        values.mul_(scale.to(torch.float32))
    else:
        assert scheme.block is not None
        rows, cols = scheme.block
        grid = scale.to(torch.float32).repeat_interleave(rows, 0)[: values.shape[0]]
        values.mul_(grid.repeat_interleave(cols, 1)[:, : values.shape[1]])
    return values.to(dtype)
