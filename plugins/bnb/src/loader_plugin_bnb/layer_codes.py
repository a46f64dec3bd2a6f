"""One layer's packed 4-bit weight while it loads: where each part's codes go.

A fused layer (``qkv_proj``, ``gate_up_proj``) holds this rank's rows of every
part stacked in one packed weight with one ``absmax`` vector, exactly the
layout bitsandbytes gives when it quantizes the stacked matrix. Parts arrive
one at a time, each already narrowed to this rank; a part lands at its row
offset, which is a byte offset in the packed data and a block offset in
``absmax`` when part boundaries fall on block boundaries. When they do not
(tiny layers, large blocksizes), in-flight parts wait in full precision until
the layer is complete and are quantized together, so the result is always
``quantize_4bit`` of this rank's whole weight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from loader.errors import CheckpointFormatError, MissingWeightsError, UnsupportedError

from .codec import quantize_blocks
from .nesting import NestedPart, NestedRange

if TYPE_CHECKING:
    from torch import nn

__all__ = ["LayerCodes", "ShardId", "tensor_of"]

ShardId = int | str | None


def tensor_of(layer: nn.Module, name: str) -> torch.Tensor:
    """``layer``'s parameter or buffer ``name`` (typed, for the packed weight and its buffers)."""
    value = getattr(layer, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name!r} of {type(layer).__name__} is not a tensor")
    return value


@attrs.define
class LayerCodes:
    """Bookkeeping of one quantized linear layer (this rank's shard).

    :ivar rows: this rank's output rows, all parts together.
    :ivar cols: this rank's input features.
    :ivar part_rows: rows of each fused part, in order (one entry if not fused).
    :ivar weight_dtype: the dtype the weight was quantized from and dequantizes to.
    :ivar nested_parts: in flight with double quantization, each part's nested codes as it arrives.
    :ivar nested: set once ``absmax`` is double-quantized: where each checkpoint module's blocks sit.
    """

    prefix: str
    rows: int
    cols: int
    part_rows: list[int]
    blocksize: int
    quant_type: str
    weight_dtype: torch.dtype
    prequantized: bool
    loaded: set[ShardId] = attrs.field(factory=set)
    pending: dict[ShardId, tuple[int, torch.Tensor]] = attrs.field(factory=dict)
    nested_parts: list[NestedPart] = attrs.field(factory=list)
    nested: tuple[NestedRange, ...] | None = None
    finished: bool = False

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def blocks(self) -> int:
        return -(-self.numel // self.blocksize)

    @property
    def parts_aligned(self) -> bool:
        """Whether every boundary between parts is a block boundary."""
        start = 0
        for size in self.part_rows[:-1]:
            start += size
            if (start * self.cols) % self.blocksize:
                return False
        return True

    # -- in flight ---------------------------------------------------------------------------------

    def place_dense(self, layer: nn.Module, shard_id: ShardId, offset: int,
                    dense: torch.Tensor) -> torch.Tensor | None:
        """Quantize this rank's rows of one part (or keep them until the layer is complete).

        Returns the part's float32 ``absmax`` when it was quantized on its
        own, ``None`` when it waits for (or completed) the whole layer.
        """
        device = tensor_of(layer, "weight").device
        if self.parts_aligned:
            packed, absmax = quantize_blocks(dense.to(device), self.blocksize, self.quant_type)
            self._write(layer, offset, packed, absmax)
            return absmax
        self.pending[shard_id] = (offset, dense)
        if len(self.pending) < len(self.part_rows):
            return None
        whole = torch.empty(self.rows, self.cols, dtype=self.weight_dtype, device=device)
        for start, part in self.pending.values():
            whole[start:start + part.shape[0]].copy_(part)
        self.pending.clear()
        self._write(layer, 0, *quantize_blocks(whole, self.blocksize, self.quant_type))
        return None

    # -- pre-quantized -----------------------------------------------------------------------------

    def adopt_header(self, layer: nn.Module, blocksize: int, quant_type: str, dtype: torch.dtype,
                     what: str) -> None:
        """Take blocksize, quant type and dtype from the first part; later parts must agree."""
        if not self.loaded:
            if blocksize != self.blocksize:
                self.blocksize = blocksize
                device = tensor_of(layer, "weight").device
                layer.weight_absmax = torch.empty(self.blocks, dtype=torch.float32, device=device)
            self.quant_type, self.weight_dtype = quant_type, dtype
            return
        if (blocksize, quant_type, dtype) != (self.blocksize, self.quant_type, self.weight_dtype):
            raise CheckpointFormatError(
                f"{what}: quantized with {quant_type}, blocksize {blocksize}, dtype {dtype}, but the other "
                f"parts of {self.prefix} used {self.quant_type}, blocksize {self.blocksize}, "
                f"dtype {self.weight_dtype}; fused parts must match"
            )

    def place_codes(self, layer: nn.Module, offset: int, size: int, packed: torch.Tensor,
                    absmax: torch.Tensor, what: str) -> None:
        """Copy a pre-quantized part's codes into place; refuse a part that straddles blocks."""
        first, count = offset * self.cols, size * self.cols
        if first % self.blocksize or (count % self.blocksize and offset + size != self.rows):
            raise UnsupportedError(
                f"{what}: its {size} x {self.cols} slice at rows [{offset}, {offset + size}) of the fused "
                f"{self.rows} x {self.cols} weight of {self.prefix} does not start and end on blocksize-"
                f"{self.blocksize} boundaries, so the parts cannot share one quantized weight"
            )
        self._write(layer, offset, packed, absmax)

    # -- shared ------------------------------------------------------------------------------------

    def _write(self, layer: nn.Module, row: int, packed: torch.Tensor, absmax: torch.Tensor) -> None:
        first = row * self.cols
        data = tensor_of(layer, "weight").data.view(-1)
        data[first // 2: first // 2 + packed.numel()].copy_(packed)
        block = first // self.blocksize
        tensor_of(layer, "weight_absmax")[block: block + absmax.numel()].copy_(absmax)

    def mark_loaded(self, shard_id: ShardId) -> None:
        self.loaded.add(shard_id)

    def check_complete(self, shard_ids: list[ShardId]) -> None:
        """Raise :class:`MissingWeightsError` naming the parts never loaded."""
        missing = [sid for sid in shard_ids if sid not in self.loaded]
        if missing or self.pending:
            raise MissingWeightsError(
                f"{self.prefix}: the checkpoint has no weights for part(s) {missing} of this fused layer"
            )
