"""4-bit blockwise codes: quantize with bitsandbytes, dequantize in plain torch.

bitsandbytes stores a weight as 4-bit indices into a 16-entry code table (NF4
or FP4), two per byte (first element in the high nibble), row-major over the
flattened ``(out, in)`` weight, plus one float ``absmax`` per block of
``blocksize`` elements. With double quantization the ``absmax`` vector is
itself stored as 8-bit codes in blocks of 256 around a mean ``offset``.

Quantizing goes through ``bitsandbytes.functional.quantize_4bit`` so the bytes
are exactly what bitsandbytes (and ``transformers``) produce. Dequantizing is
done here in torch: it is a table lookup and a multiply, runs on any device,
and does not depend on the native CPU kernel, which returns wrong values for
blocksizes 128-1024 when a block is longer than a row.
"""

from __future__ import annotations

import attrs
import torch

__all__ = [
    "NESTED_BLOCKSIZE",
    "NestedAbsmax",
    "code_table",
    "dequantize_absmax",
    "dequantize_blocks",
    "nest_absmax",
    "quantize_blocks",
    "unpack_codes",
]

NESTED_BLOCKSIZE = 256
"""Block length bitsandbytes uses when it quantizes ``absmax`` (double quantization)."""


def code_table(quant_type: str, device: torch.device | str = "cpu") -> torch.Tensor:
    """The 16 float32 values a 4-bit code stands for (``"nf4"`` or ``"fp4"``)."""
    from bitsandbytes.functional import get_4bit_type

    return get_4bit_type(quant_type, device=device)  # type: ignore[no-any-return]


def quantize_blocks(
    dense: torch.Tensor, blocksize: int, quant_type: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize ``dense`` (any shape) to ``(packed uint8 [ceil(n/2)], absmax float32 [ceil(n/blocksize)])``.

    Blocks run over the flattened values, so quantizing the rows of a
    matrix in pieces whose element counts are multiples of ``blocksize``
    gives the same bytes as quantizing it whole.
    """
    from bitsandbytes.functional import quantize_4bit

    packed, state = quantize_4bit(
        dense.contiguous(), blocksize=blocksize, quant_type=quant_type, compress_statistics=False
    )
    return packed.reshape(-1), state.absmax.reshape(-1).to(torch.float32)


@attrs.frozen
class NestedAbsmax:
    """A double-quantized ``absmax``: 8-bit codes, their block scales, code table and offset."""

    codes: torch.Tensor
    scales: torch.Tensor
    code: torch.Tensor
    offset: float
    blocksize: int = NESTED_BLOCKSIZE


def nest_absmax(absmax: torch.Tensor) -> NestedAbsmax:
    """Double-quantize ``absmax`` exactly as ``quantize_4bit(compress_statistics=True)`` does."""
    from bitsandbytes.functional import quantize_blockwise

    offset = absmax.mean()
    codes, state = quantize_blockwise(absmax - offset, blocksize=NESTED_BLOCKSIZE)
    return NestedAbsmax(codes.reshape(-1), state.absmax.reshape(-1).to(torch.float32),
                        state.code.to(torch.float32), float(offset))


def dequantize_absmax(codes: torch.Tensor, scales: torch.Tensor, code: torch.Tensor, offset: float,
                      blocksize: int = NESTED_BLOCKSIZE, start: int = 0,
                      index: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 ``absmax`` from its 8-bit codes, the way bitsandbytes computes it before dequantizing.

    ``code[codes] * scales[block] + offset``, in float32, so the result is
    bit-identical to bitsandbytes' own nested dequantization. ``codes`` may
    be a window starting at entry ``start`` of the full vector, or any
    selection of it whose positions ``index`` gives; ``scales`` is always
    the full vector of block scales.
    """
    values = code.to(torch.float32)[codes.reshape(-1).long()]
    if index is None:
        index = torch.arange(start, start + values.numel(), device=values.device)
    per_value = scales.to(torch.float32).reshape(-1)[index // blocksize]
    return values * per_value + torch.tensor(offset, dtype=torch.float32, device=values.device)


def unpack_codes(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """The ``numel`` 4-bit indices held in ``packed``, high nibble first."""
    flat = packed.reshape(-1)
    pairs = torch.stack((flat >> 4, flat & 0x0F), dim=1).reshape(-1)
    return pairs[:numel]


def dequantize_blocks(packed: torch.Tensor, absmax: torch.Tensor, code: torch.Tensor,
                      shape: tuple[int, ...], blocksize: int, dtype: torch.dtype) -> torch.Tensor:
    """The weight ``shape`` in ``dtype`` from packed codes and float32 per-block ``absmax``.

    Matches ``bitsandbytes.functional.dequantize_4bit`` bit for bit where the
    native kernel is right (the product is formed in float32, then rounded
    to ``dtype``).
    """
    numel = 1
    for s in shape:
        numel *= s
    values = code.to(torch.float32)[unpack_codes(packed, numel).long()]
    blocks = -(-numel // blocksize)
    padded = blocks * blocksize
    if padded != numel:
        values = torch.nn.functional.pad(values, (0, padded - numel))
    scaled = values.view(blocks, blocksize) * absmax.to(torch.float32).view(blocks, 1)
    return scaled.reshape(-1)[:numel].view(shape).to(dtype)
