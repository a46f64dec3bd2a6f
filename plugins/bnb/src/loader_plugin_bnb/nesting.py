"""Double quantization in flight: each checkpoint module's block scales nested on their own.

bitsandbytes' double quantization stores a weight's float32 ``absmax`` (one
per block of 64 values) as 8-bit codes around the mean of that weight's
whole ``absmax`` vector, in blocks of 256 with their own scales.
``transformers`` quantizes ``q_proj``, ``k_proj``, ``gate_proj`` ... one
module at a time, so each has its own nested statistics. A fused layer here
stacks several modules, and a tensor-parallel rank holds only a slice of
each: nesting the rank's fused ``absmax`` in one go gave numbers that
matched neither ``transformers`` nor another TP size. So each part is nested
over its *whole* checkpoint module (read whole once, on ranks that hold only
a slice of it), and the rank keeps the codes of its own blocks plus the
module's scales and mean; :class:`NestedRange` records where they sit so the
codes dequantize exactly as the module's would.
"""

from __future__ import annotations

import attrs
import torch

from .codec import NESTED_BLOCKSIZE, dequantize_absmax, nest_absmax

__all__ = [
    "NestedLayer",
    "NestedPart",
    "NestedRange",
    "assemble",
    "dequantize_layer",
    "module_blocks",
    "nest_part",
]


@attrs.frozen
class NestedRange:
    """Where one checkpoint module's double-quantized block scales sit in a layer (this rank's share).

    :ivar first_block: the module's first block in the layer's ``absmax`` vector.
    :ivar blocks: how many of the layer's blocks are this module's.
    :ivar scale_base: the module's first nested scale in the layer's ``weight_nested_absmax``.
    :ivar offset: the mean the module's ``absmax`` was nested around.
    :ivar module_first: the module block that the layer's ``first_block`` holds.
    :ivar run_blocks: the rank's blocks come in runs of this many consecutive module blocks
        (a whole row slice; all of them when the rank holds whole rows) ...
    :ivar run_stride: ... that start this many module blocks apart (blocks per full row).
    """

    first_block: int
    blocks: int
    scale_base: int
    offset: float
    module_first: int
    run_blocks: int
    run_stride: int

    def module_index(self, device: torch.device) -> torch.Tensor:
        """The module's block index of each of this range's blocks."""
        local = torch.arange(self.blocks, device=device)
        return self.module_first + (local // self.run_blocks) * self.run_stride + local % self.run_blocks

    def dequantize(self, codes: torch.Tensor, scales: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
        """Float32 ``absmax`` of this range from the layer's codes, scales and nested code table."""
        own = codes[self.first_block:self.first_block + self.blocks]
        module_scales = scales[self.scale_base:]
        return dequantize_absmax(own, module_scales, code, self.offset, NESTED_BLOCKSIZE,
                                 index=self.module_index(codes.device))


@attrs.frozen
class NestedPart:
    """One part's nested codes (this rank's blocks), with the module's scales, before the layer is assembled."""

    range: NestedRange
    codes: torch.Tensor
    scales: torch.Tensor
    code: torch.Tensor


def module_blocks(whole_shape: tuple[int, ...], rows: tuple[int, int] | None, cols: tuple[int, int] | None,
                  blocksize: int) -> tuple[int, int, int, int] | None:
    """``(module_first, run_blocks, run_stride, count)`` of a rank's piece of a module, in module blocks.

    ``None`` when the piece is not made of whole blocks of the module (its
    own quantization then differs from the module's anyway).
    """
    full_rows, full_cols = int(whole_shape[0]), int(whole_shape[1])
    r0, nr = rows if rows is not None else (0, full_rows)
    c0, nc = cols if cols is not None else (0, full_cols)
    if (c0, nc) == (0, full_cols):
        first, count = r0 * full_cols, nr * full_cols
        if first % blocksize or (count % blocksize and r0 + nr != full_rows):
            return None
        blocks = -(-count // blocksize)
        return first // blocksize, blocks, blocks, blocks
    if full_cols % blocksize or c0 % blocksize or nc % blocksize:
        return None
    per_row = full_cols // blocksize
    return r0 * per_row + c0 // blocksize, nc // blocksize, per_row, nr * (nc // blocksize)


def nest_part(module_absmax: torch.Tensor, first_block: int,
              placement: tuple[int, int, int, int]) -> NestedPart:
    """Nest a whole module's ``absmax`` and keep this rank's blocks of it (``placement`` from :func:`module_blocks`)."""
    module_first, run_blocks, run_stride, count = placement
    nested = nest_absmax(module_absmax)
    where = NestedRange(first_block, count, 0, nested.offset, module_first, run_blocks, run_stride)
    mine = nested.codes[where.module_index(nested.codes.device)]
    return NestedPart(where, mine, nested.scales, nested.code)


@attrs.frozen
class NestedLayer:
    """A layer's nested ``absmax``: codes of every block, each module's scales, and where each module sits."""

    codes: torch.Tensor
    scales: torch.Tensor
    code: torch.Tensor
    ranges: tuple[NestedRange, ...]


def assemble(parts: list[NestedPart], blocks: int) -> NestedLayer:
    """The layer's buffers from its parts' nested codes (parts may have arrived in any order)."""
    ordered = sorted(parts, key=lambda p: p.range.first_block)
    if sum(p.range.blocks for p in ordered) != blocks:
        raise AssertionError(f"nested parts cover {sum(p.range.blocks for p in ordered)} of {blocks} blocks")
    codes = torch.cat([p.codes for p in ordered])
    ranges, base = [], 0
    for part in ordered:
        ranges.append(attrs.evolve(part.range, scale_base=base))
        base += part.scales.numel()
    return NestedLayer(codes, torch.cat([p.scales for p in ordered]), ordered[0].code, tuple(ranges))


def dequantize_layer(codes: torch.Tensor, scales: torch.Tensor, code: torch.Tensor,
                     ranges: tuple[NestedRange, ...]) -> torch.Tensor:
    """The layer's float32 ``absmax``, each module's blocks dequantized with that module's statistics."""
    return torch.cat([r.dequantize(codes, scales, code) for r in ranges])
