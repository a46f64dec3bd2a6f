"""Write a complete :class:`~.conversions.FusedGroup` into its parameters, each input read once, into place.

A layout piece names a region of the parameter and the input (narrowed, dims
permuted) that fills it; the region is a view of the parameter's memory, so
a stacked expert is read straight into its slice of the 3-D parameter. A
piece that fills a whole parameter goes through that parameter's weight
loader instead, so a loader layer (sharded or quantized, :mod:`.parallel`)
takes its share exactly as it does for an unconverted tensor; a sharded
expert parameter (:mod:`.expert_sharding`) takes its rank's rows of each part.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from loader.errors import ShapeMismatchError, UnexpectedWeightError, UnsupportedError
from loader.layers import layout_of, weight_loader_of

from .transposed import PermutedTensor

if TYPE_CHECKING:
    from loader.weights import CheckpointTensor

    from .conversion_ops import Layout, Piece
    from .conversions import FusedGroup
    from .expert_sharding import ShardedExperts

__all__ = ["piece_tensor", "write_group"]


def piece_tensor(group: FusedGroup, piece: Piece) -> CheckpointTensor:
    """The input of ``piece``, narrowed to its share and with its dims in the region's order (nothing read)."""
    tensor = group.sources[piece.source].tensors[piece.item]
    for dim, start, length in piece.narrows:
        tensor = tensor.narrow(dim, start, length)
    order = tuple(dim for dim in piece.dims if dim is not None)
    return tensor if order == tuple(range(len(order))) else PermutedTensor(tensor, order)


def _fills_whole(layout: Layout, piece: Piece) -> bool:
    return all(dim is not None for dim in piece.dims) and all(
        region == (0, size) for region, size in zip(piece.region, layout.shape, strict=True))


def _check_region(group: FusedGroup, target: str, shape: tuple[int, ...], piece: Piece) -> None:
    for (start, length), size, dim in zip(piece.region, shape, piece.dims, strict=True):
        if start + length > size:
            tensor = group.sources[piece.source].tensors[piece.item]
            if dim is None:
                raise UnexpectedWeightError(f"{tensor.describe()}: expert {piece.item} is out of range for "
                                            f"{target}, which holds {size} experts")
            raise ShapeMismatchError(f"{tensor.describe()}: its values reach row {start + length} of dimension of "
                                     f"size {size} in {target} (shape {shape})")


def _write_layout(group: FusedGroup, target: str, param: torch.Tensor, layout: Layout,
                  sharded: ShardedExperts | None) -> None:
    """Every piece of ``layout`` into its region of ``param``."""
    whole_shape = sharded.whole_shape if sharded is not None else tuple(param.shape)
    if layout.shape != whole_shape:
        first = next(iter(group.sources.values()))
        raise ShapeMismatchError(
            f"{next(iter(first.tensors.values())).describe()}: converted as transformers does, the inputs of "
            f"{target} make shape {layout.shape}, and {group.label} expects {whole_shape}"
        )
    data = param.data
    for piece in layout.pieces:
        _check_region(group, target, whole_shape, piece)
        for region, tensor in (sharded.local_parts(piece, piece_tensor(group, piece)) if sharded is not None
                               else [(piece.region, piece_tensor(group, piece))]):
            index = tuple(start if dim is None else slice(start, start + length)
                          for dim, (start, length) in zip(piece.dims, region, strict=True))
            with torch.no_grad():
                tensor.read_into(data[index])


def write_group(group: FusedGroup, params: Mapping[str, torch.Tensor],
                shapes: Mapping[str, tuple[int, ...]], sharded: Mapping[str, ShardedExperts]) -> set[str]:
    """Place every input of ``group`` into its parameter(s); return the parameter names filled.

    :param shapes: each parameter's shape as transformers builds it (a sharded expert's whole shape).
    :param sharded: the expert parameters this rank holds a share of, by name.
    """
    layouts = group.layouts(shapes, count=group.count)
    for target, layout in layouts.items():
        param = params.get(target)
        if param is None:
            raise UnexpectedWeightError(f"{group.label}: transformers converts tensors into {target}, which is not "
                                        "a parameter of the model (a tied or computed one)")
        share = sharded.get(target)
        if share is None and len(layout.pieces) == 1 and _fills_whole(layout, layout.pieces[0]):
            weight_loader_of(param)(param, piece_tensor(group, layout.pieces[0]))
            continue
        if share is None and layout_of(param).weight_loader is not None:
            raise UnsupportedError(
                f"{group.label}: {target} is fused from several checkpoint tensors, and its layer is sharded or "
                "quantized here, which the transformers fallback cannot fill piece by piece; load it with tp=1 "
                "and no quantization"
            )
        _write_layout(group, target, param, layout, share)
    return set(layouts)
