"""How one FP8 checkpoint tensor lands in this rank's parameter of a (fused, parallel) linear layer.

The weight and per-row scales go through the layer's own ``weight_loader``
(it splits fused tensors, checks shapes, narrows to this rank) and land here
with a dtype check: an FP8 layer whose ``weight`` is stored as bf16 is a
different checkpoint, and copying it would silently drop its scales' meaning.
Per-tensor values and block grids are not rows of the weight, so their loaders
are written here: a part's scalar goes to its index, a part's block rows to
its block-aligned offset, narrowed to this rank's blocks
(:func:`~.fp8_scheme.fp8_geometry` has refused splits that cut a block).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from loader.errors import CheckpointFormatError
from loader.weights import check_shape

from .fp8_scheme import FP8_DTYPE, Fp8Geometry

if TYPE_CHECKING:
    from loader.layers import NarrowedPart
    from loader.weights import CheckpointTensor

__all__ = ["SCALE_DTYPES", "land_block_scales", "land_fp8_weight", "land_part_scalar", "land_row_scales"]

SCALE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _read_scale(loaded: CheckpointTensor, what: str) -> torch.Tensor:
    if loaded.dtype not in SCALE_DTYPES:
        raise CheckpointFormatError(
            f"{loaded.describe()}: {what} is stored as {_dtype_name(loaded.dtype)}; FP8 scales are float32, "
            "bfloat16 or float16")
    return loaded.read(torch.float32)


def land_fp8_weight(prefix: str, param: torch.Tensor, part: NarrowedPart) -> None:
    """Copy this rank's rows of an FP8 ``weight`` part, refusing any other stored dtype."""
    loaded = part.narrowed
    if loaded.dtype != FP8_DTYPE:
        raise CheckpointFormatError(
            f"{loaded.describe()}: {prefix} is an FP8 layer whose weight must be stored as F8_E4M3 "
            f"(float8_e4m3fn), found {_dtype_name(loaded.dtype)}")
    loaded.read_into(param.data.narrow(0, part.offset, part.size))


def land_row_scales(prefix: str, param: torch.Tensor, part: NarrowedPart) -> None:
    """Copy this rank's per-row scales of a part (``[rows, 1]``) as float32."""
    param.data.narrow(0, part.offset, part.size).copy_(_read_scale(part.narrowed, f"the scale of {prefix}"))


def land_part_scalar(geometry: Fp8Geometry, name: str, param: torch.Tensor, loaded: CheckpointTensor,
                     shard_id: object = None) -> None:
    """A per-tensor value (``[]`` or ``[1]``) at its part's index; without a part, at every index."""
    if loaded.numel() != 1:
        raise CheckpointFormatError(
            f"{loaded.describe()}: {geometry.prefix}.{name} is one value per tensor (shape [] or [1]), found "
            f"shape {list(loaded.shape)}")
    value = _read_scale(loaded, f"{geometry.prefix}.{name}").reshape(())
    if shard_id is None:
        param.data.fill_(value)
    else:
        param.data[geometry.part_index(shard_id)] = value


def land_block_scales(geometry: Fp8Geometry, name: str, param: torch.Tensor, loaded: CheckpointTensor,
                      shard_id: object = None) -> None:
    """This rank's rows and columns of one part's block grid ``[ceil(N/bn), ceil(K/bk)]``.

    Without a part on a fused layer the tensor holds every part's grid stacked (a pre-fused checkpoint):
    each part's rows are cut out and landed in turn.
    """
    assert geometry.block is not None
    block_rows, block_cols = geometry.block
    if shard_id is None and len(geometry.parts) > 1:
        counts = [math.ceil(part.full / block_rows) for part in geometry.parts]
        check_shape(loaded, (sum(counts), math.ceil(geometry.input_size / block_cols)),
                    f"{geometry.prefix}.{name} (fused)")
        start = 0
        for part, count in zip(geometry.parts, counts, strict=True):
            land_block_scales(geometry, name, param, loaded.narrow(0, start, count), part.shard_id)
            start += count
        return
    part = geometry.part(shard_id)
    expected = (math.ceil(part.full / block_rows), math.ceil(geometry.input_size / block_cols))
    label = f"{geometry.prefix}.{name}" + ("" if shard_id is None else f" part {shard_id!r}")
    check_shape(loaded, expected, f"{label} ({block_rows}x{block_cols} blocks over [{part.full}, "
                                  f"{geometry.input_size}])")
    rows = math.ceil(part.length / block_rows)
    narrowed = loaded.narrow(0, part.start // block_rows, rows)
    narrowed = narrowed.narrow(1, geometry.input_start // block_cols, geometry.block_cols)
    param.data[part.offset // block_rows : part.offset // block_rows + rows].copy_(_read_scale(narrowed, label))
