"""Which module blocks a rank's piece holds, and nesting them so they dequantize as the whole module's."""

from __future__ import annotations

import torch

from loader_plugin_bnb.codec import dequantize_absmax, nest_absmax, quantize_blocks
from loader_plugin_bnb.nesting import assemble, dequantize_layer, module_blocks, nest_part


def test_module_blocks_of_row_and_column_slices():
    assert module_blocks((8, 128), (2, 4), None, 64) == (4, 8, 8, 8)  # whole rows: one run
    assert module_blocks((8, 128), (0, 8), (64, 64), 64) == (1, 1, 2, 8)  # right half of every row
    assert module_blocks((8, 128), None, None, 64) == (0, 16, 16, 16)


def test_pieces_that_are_not_whole_module_blocks_have_no_placement():
    assert module_blocks((8, 42), (1, 3), None, 64) is None  # starts mid-block
    assert module_blocks((8, 128), (0, 8), (32, 96), 64) is None  # columns cut a block
    assert module_blocks((3, 42), (1, 2), None, 64) is None
    assert module_blocks((3, 42), (0, 3), None, 64) == (0, 2, 2, 2)  # the whole tensor, last block partial


def test_a_column_slice_dequantizes_to_the_whole_modules_values():
    weight = torch.randn(300, 128, generator=torch.Generator().manual_seed(0))
    absmax = quantize_blocks(weight, 64, "nf4")[1]  # 600 blocks: three nested blocks of 256
    whole = nest_absmax(absmax)
    expected = dequantize_absmax(whole.codes, whole.scales, whole.code, whole.offset).view(300, 2)[:, 1]
    part = nest_part(absmax, 0, module_blocks((300, 128), None, (64, 64), 64))
    layer = assemble([part], 300)
    assert torch.equal(dequantize_layer(layer.codes, layer.scales, layer.code, layer.ranges), expected)
