"""What a packed checkpoint format declares per layer: its tensors' shapes and splits, and how to read them.

A format (GPTQ, AWQ, compressed-tensors) is a :class:`CheckpointLayout`:
:meth:`~CheckpointLayout.params` lists the tensors one layer holds on this
rank as :class:`ParamSpec` records — the shared quantize method turns them
into parameters with the core's :class:`~loader.layers.param_layout.ParamLayout`,
so the layer's own ``weight_loader`` splits fused tensors and narrows them
to this rank — and :meth:`~CheckpointLayout.to_quantized` converts the loaded
tensors into the one internal representation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs
import torch

from loader.errors import CheckpointFormatError

from .layer_geometry import LayerGeometry
from .quantized_weight import QuantizedWeight

if TYPE_CHECKING:
    from loader.layers import NarrowedPart
    from loader.weights import CheckpointTensor

__all__ = ["CheckpointLayout", "ParamSpec", "land_part_scalar", "land_shape_record", "land_shared_g_idx"]


@attrs.frozen
class ParamSpec:
    """One checkpoint tensor of a layer, as a parameter on this rank.

    :ivar kind: ``copy`` (the narrowed rows are copied), ``g_idx`` (every fused
        part must bring the same one), ``shape`` (a per-part record of the
        unpacked shape, checked against the layer and not kept) or
        ``part_scalar`` (one value per part, kept at the part's index).
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    output_dim: int | None = None
    input_dim: int | None = None
    packed_dim: int | None = None
    pack_factor: int = 1
    kind: str = "copy"


class CheckpointLayout(Protocol):
    """A packed format's tensors for one layer, and their conversion to :class:`QuantizedWeight`.

    ``input_pack``/``output_pack``: whether the format packs values along the
    input / output dim (what a tensor-parallel split must respect).
    """

    @property
    def input_pack(self) -> bool: ...

    @property
    def output_pack(self) -> bool: ...

    def params(self, geometry: LayerGeometry) -> list[ParamSpec]: ...

    def to_quantized(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> QuantizedWeight: ...


def land_shared_g_idx(destination: torch.Tensor, part: NarrowedPart, first_part: object | None, what: str) -> None:
    """Copy a ``g_idx`` part (kind ``g_idx``) into ``destination``; when part ``first_part`` already landed
    there, the two must be equal: fused parts share one input, so one act-order.

    :param what: the parameter, for the message.
    """
    values = part.narrowed.read(torch.int32)
    if first_part is not None and not torch.equal(values, destination):
        raise CheckpointFormatError(
            f"{part.narrowed.describe()}: {what} of part {part.shard_id!r} differs from part {first_part!r}; "
            "the fused parts share one input and must share one g_idx"
        )
    destination.copy_(values)


def land_shape_record(destination: torch.Tensor, part: NarrowedPart, expected: list[int], what: str) -> None:
    """Check a per-part ``[rows, cols]`` record of the unpacked weight (kind ``shape``) against ``expected``
    and keep it in ``destination``.

    :param what: the layer part, for the message.
    """
    values = [int(v) for v in part.narrowed.read(torch.int64).flatten().tolist()]
    if values != expected:
        raise CheckpointFormatError(
            f"{part.narrowed.describe()}: records an unpacked weight of shape {values}, but {what} has shape "
            f"{expected}"
        )
    destination.copy_(torch.tensor(expected, dtype=destination.dtype))


def land_part_scalar(shard_ids: Sequence[object], param: torch.Tensor, loaded: CheckpointTensor,
                     shard_id: object = None) -> None:
    """The weight loader of a kind ``part_scalar`` parameter: part ``shard_id``'s one value (a per-tensor scale,
    the same on every rank) at its index among the layer's ``shard_ids``; more than one value is refused."""
    values = loaded.read(torch.float32).reshape(-1)
    if values.numel() != 1:
        raise CheckpointFormatError(f"{loaded.describe()}: a per-tensor scale must hold one value, found "
                                    f"{values.numel()}")
    index = shard_ids.index(shard_id) if shard_id in shard_ids else 0
    param.data[index] = values[0]
