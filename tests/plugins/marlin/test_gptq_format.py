"""The GPTQ reference packer against the plugin's unpacking, and the checks on g_idx values."""

from __future__ import annotations

import itertools

import pytest
import torch

from loader.errors import CheckpointFormatError
from loader_plugin_marlin.bit_packing import pack_int32, unpack_int32
from loader_plugin_marlin.gptq_format import check_g_idx, gptq_to_quantized
from tests.helpers.gptq_checkpoints import Quantized, dequantize, make_g_idx, pack_gptq, quantize

COMBOS = list(itertools.product((4, 8), (-1, 32, 64, 128), (True, False), (False, True), ("gptq", "gptq_v2")))


def _unpack(tensors, q: Quantized, group_size: int, checkpoint_format: str):
    return gptq_to_quantized(tensors["qweight"], tensors["qzeros"], tensors["scales"], tensors["g_idx"],
                             bits=q.bits, group_size=group_size, zeros_minus_one=checkpoint_format == "gptq")


# K = 160: group 64 and 128 leave a partial last group (GPTQModel writes those).
@pytest.mark.parametrize(("bits", "group_size", "sym", "act_order", "checkpoint_format"), COMBOS)
def test_every_combination_unpacks_to_the_packed_codes_and_dequantizes_bit_exactly(
        bits, group_size, sym, act_order, checkpoint_format):
    weight = torch.randn(48, 160, generator=torch.Generator().manual_seed(bits + group_size))
    q = quantize(weight, bits, group_size, sym=sym, act_order=act_order)
    unpacked = _unpack(pack_gptq(q, checkpoint_format=checkpoint_format), q, group_size, checkpoint_format)
    assert torch.equal(unpacked.codes.to(torch.int32), q.codes)
    assert torch.equal(unpacked.zeros, q.zeros)
    assert torch.equal(unpacked.dequantize(), dequantize(q))
    assert unpacked.act_order == (act_order and group_size != -1)  # one group: any order is the same
    if sym:
        assert unpacked.is_symmetric()
    step = weight.abs().max() / (2 ** (bits - 1) - 1)
    assert float((unpacked.dequantize() - weight).abs().max()) <= float(step) * 1.01


def test_symmetric_4bit_v1_zeros_are_stored_as_0x77777777():
    q = quantize(torch.randn(16, 64), 4, 32, sym=True)
    assert (pack_gptq(q)["qzeros"] == 0x77777777).all()
    assert (pack_gptq(q, checkpoint_format="gptq_v2")["qzeros"] == -0x77777778).all()  # 0x88888888


def test_a_v1_zero_of_0_wraps_and_reads_back_as_2_to_the_bits_as_the_kernels_do():
    q = quantize(torch.randn(16, 64), 4, 32, sym=False)
    zeros = q.zeros.clone()
    zeros[0, 0] = 0
    wrapped = Quantized(q.codes, q.scales, zeros, q.g_idx, 4)
    unpacked = _unpack(pack_gptq(wrapped), wrapped, 32, "gptq")
    assert int(unpacked.zeros[0, 0]) == 16
    assert torch.equal(unpacked.zeros[1:], zeros[1:])


@pytest.mark.parametrize("bits", [4, 8])
def test_bit_packing_round_trips_along_either_dimension(bits):
    codes = torch.randint(0, 1 << bits, (16, 24), dtype=torch.uint8)
    for dim in (0, 1):
        assert torch.equal(unpack_int32(pack_int32(codes, bits, dim), bits, dim), codes)
    with pytest.raises(ValueError, match="do not fill whole int32 words"):
        pack_int32(codes[:, :3], bits, 1)


def test_act_order_g_idx_has_full_groups_in_a_shuffled_order():
    g_idx = make_g_idx(160, 64, act_order=True)
    assert torch.bincount(g_idx).tolist() == [64, 64, 32]
    assert not torch.equal(g_idx, make_g_idx(160, 64, act_order=False))


def _check(g_idx, groups=3, group_size=64, act_order=False, whole=True, first_group=0):
    return check_g_idx(g_idx, groups, group_size, act_order=act_order, whole=whole, first_group=first_group,
                       what="model.layers.0.mlp.down_proj")


def test_g_idx_out_of_range_names_the_layer_and_the_groups():
    g_idx = make_g_idx(160, 64, act_order=False)
    g_idx[5] = 3
    with pytest.raises(CheckpointFormatError, match=r"^model.layers.0.mlp.down_proj.g_idx: group numbers span "
                       r"\[0, 3\] but scales have groups \[0, 2\]$"):
        _check(g_idx)
    g_idx[5] = -1
    with pytest.raises(CheckpointFormatError, match=r"span \[-1, 2\]"):
        _check(g_idx)


def test_g_idx_inconsistent_with_group_size_is_refused_without_act_order():
    g_idx = make_g_idx(160, 64, act_order=False)
    g_idx[[3, 100]] = g_idx[[100, 3]]
    with pytest.raises(CheckpointFormatError, match=r"down_proj.g_idx: row 3 is in group 1, but with group_size "
                       r"64 without act-order it belongs to group 0"):
        _check(g_idx)


def test_act_order_g_idx_with_a_wrong_group_count_is_refused():
    g_idx = make_g_idx(160, 64, act_order=True)
    g_idx[g_idx == 2] = 1  # group 1 now has 96 rows
    with pytest.raises(CheckpointFormatError, match=r"down_proj.g_idx: group 1 has 96 rows, inconsistent with "
                       r"group_size 64 over 160 input rows"):
        _check(g_idx, act_order=True)
    assert torch.equal(_check(make_g_idx(160, 64, act_order=True), act_order=True),
                       make_g_idx(160, 64, act_order=True))


def test_a_rank_s_g_idx_becomes_local_rows_of_its_scales():
    g_idx = make_g_idx(256, 64, act_order=False)[128:]
    assert _check(g_idx, groups=2, first_group=2, whole=False).tolist() == [0] * 64 + [1] * 64
