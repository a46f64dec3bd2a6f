"""4-bit codes: quantized by bitsandbytes, dequantized in torch bit-for-bit like bitsandbytes."""

from __future__ import annotations

import bitsandbytes.functional as F
import pytest
import torch

from loader_plugin_bnb.codec import (
    code_table,
    dequantize_absmax,
    dequantize_blocks,
    nest_absmax,
    quantize_blocks,
    unpack_codes,
)


def _weight(shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(96, 64), (33, 64), (5, 7)])
def test_quantize_and_dequantize_match_bitsandbytes_exactly(quant_type, dtype, shape):
    w = _weight(shape, dtype)
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type=quant_type)
    mine_packed, mine_absmax = quantize_blocks(w, 64, quant_type)
    assert torch.equal(mine_packed, packed.view(-1))
    assert torch.equal(mine_absmax, state.absmax)
    ours = dequantize_blocks(mine_packed, mine_absmax, code_table(quant_type), shape, 64, dtype)
    assert ours.dtype == dtype
    assert torch.equal(ours, F.dequantize_4bit(packed, state))


@pytest.mark.parametrize("blocksize", [128, 256, 1024])
def test_dequantize_is_right_where_the_native_cpu_kernel_is_not(blocksize):
    # bitsandbytes 0.50's CPU dequantize is wrong when a block is longer than a row (blocksize 128-1024);
    # check against the definition instead: value = table[code] * absmax[block].
    w = _weight((8, 64))
    packed, absmax = quantize_blocks(w, blocksize, "nf4")
    table = code_table("nf4")
    codes = unpack_codes(packed, w.numel())
    expected = torch.tensor([float(table[int(codes[i])]) * float(absmax[i // blocksize]) for i in range(w.numel())])
    ours = dequantize_blocks(packed, absmax, table, (8, 64), blocksize, torch.float32)
    assert torch.equal(ours.view(-1), expected)
    assert (ours - w).abs().max() <= absmax.max() * 0.2


def test_blocks_of_row_pieces_equal_blocks_of_the_whole():
    w = _weight((96, 64))
    whole = quantize_blocks(w, 64, "fp4")
    top, bottom = quantize_blocks(w[:32], 64, "fp4"), quantize_blocks(w[32:], 64, "fp4")
    assert torch.equal(torch.cat([top[0], bottom[0]]), whole[0])
    assert torch.equal(torch.cat([top[1], bottom[1]]), whole[1])


def test_double_quantization_matches_compress_statistics():
    w = _weight((300, 64))
    _, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
    nested = nest_absmax(quantize_blocks(w, 64, "nf4")[1])
    assert torch.equal(nested.codes, state.absmax)
    assert torch.equal(nested.scales, state.state2.absmax)
    assert nested.offset == float(state.offset)
    expected = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    full = dequantize_absmax(nested.codes, nested.scales, nested.code, nested.offset)
    assert torch.equal(full, expected)
    window = dequantize_absmax(nested.codes[250:290], nested.scales, nested.code, nested.offset, start=250)
    assert torch.equal(window, expected[250:290])
