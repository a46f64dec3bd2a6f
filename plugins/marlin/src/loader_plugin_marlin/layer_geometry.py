"""One layer's shard of a packed checkpoint: its rows, columns and groups on this rank, checked once.

Every packed format splits the same way under tensor parallelism:
column-parallel and fused layers take whole output columns (formats that
pack along the output dim need each part's columns to be whole int32 words),
row-parallel layers take input rows (whole words for formats that pack along
the input dim) and, without act-order, their own groups — so a rank's rows
must be whole groups. With act-order a rank's rows may belong to any group,
so every rank keeps all groups (vLLM's rule). A split the format cannot
express is refused here, naming the layer and the TP size, before any
parameter exists.
"""

from __future__ import annotations

import attrs

from loader.errors import UnsupportedError

__all__ = ["LayerGeometry", "layer_geometry"]


@attrs.frozen
class LayerGeometry:
    """This rank's share of one quantized linear layer.

    :ivar prefix: the layer, for messages.
    :ivar rows: input features on this rank (``K``).
    :ivar cols: output features on this rank, all fused parts (``N``).
    :ivar parts: this rank's output features of each fused part.
    :ivar input_size: input features of the whole layer.
    :ivar groups: rows of ``scales`` on this rank.
    :ivar first_group: the global group of this rank's first ``scales`` row.
    :ivar shard_groups: whether ``scales`` are split along the input (row-parallel without act-order).
    :ivar whole_input: whether this rank holds every input row.
    """

    prefix: str
    rows: int
    cols: int
    parts: tuple[int, ...]
    input_size: int
    groups: int
    first_group: int
    shard_groups: bool
    whole_input: bool

    @property
    def scale_input_dim(self) -> int | None:
        """``0`` when group rows are split over ranks like input rows, else ``None`` (whole on every rank)."""
        return 0 if self.shard_groups else None


def layer_geometry(prefix: str, rows: int, parts: list[int], input_size: int, *, tp_rank: int, tp_size: int,
                   bits: int, group_size: int, act_order: bool, input_pack: bool, output_pack: bool) -> LayerGeometry:
    """The checked geometry of one layer's shard.

    :param input_pack: whether the format packs codes along the input dim (GPTQ ``qweight``).
    :param output_pack: whether it packs anything along the output dim (zero points, AWQ ``qweight``).
    """
    pack = 32 // bits
    tp = f"tensor parallel size {tp_size}"
    if input_pack and rows % pack:
        raise UnsupportedError(
            f"{prefix}: {rows} input rows per rank ({tp}) are not whole int32 words of {pack} {bits}-bit codes, "
            "so the packed weight cannot be split there"
        )
    for part in parts:
        if output_pack and part % pack:
            raise UnsupportedError(
                f"{prefix}: {part} output columns of a part per rank ({tp}) are not whole int32 words of {pack} "
                f"{bits}-bit values, so the tensors packed along the output cannot be split there"
            )
    split = rows != input_size
    group = input_size if group_size == -1 else group_size
    shard_groups = split and group_size != -1 and not act_order
    if shard_groups and rows % group:
        raise UnsupportedError(
            f"{prefix}: {tp} gives each rank {rows} of the {input_size} input rows, which cuts a group of "
            f"{group} rows; scales and zero points cannot be split inside a group"
        )
    groups = rows // group if shard_groups else -(-input_size // group)
    return LayerGeometry(prefix=prefix, rows=rows, cols=sum(parts), parts=tuple(parts), input_size=input_size,
                         groups=groups, first_group=tp_rank * groups if shard_groups else 0,
                         shard_groups=shard_groups, whole_input=not split)
