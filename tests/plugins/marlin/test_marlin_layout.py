"""The Marlin repack inverts exactly for every bits × group × act-order × sym, and refuses what Marlin cannot take."""

from __future__ import annotations

import itertools

import attrs
import pytest
import torch

from loader_plugin_marlin.bit_packing import pack_int32
from loader_plugin_marlin.gptq_format import gptq_to_quantized
from loader_plugin_marlin.marlin_layout import marlin_unsupported_reason, repack, unpack
from loader_plugin_marlin.quantized_weight import QuantizedWeight
from tests.helpers.gptq_checkpoints import dequantize, pack_gptq, quantize


def _weight(bits, group_size, sym, act_order, n=128, k=256, zeros=None):
    q = quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(bits * 7 + group_size)), bits,
                 group_size, sym=sym, act_order=act_order)
    t = pack_gptq(q, checkpoint_format="gptq_v2")
    weight = gptq_to_quantized(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits=bits,
                               group_size=group_size, zeros_minus_one=False)
    if zeros is not None:  # values the packer cannot write (a v1 zero read back as 2**bits)
        weight = attrs.evolve(weight, zeros=zeros(weight.zeros))
    return weight, q


COMBOS = list(itertools.product((4, 8), (-1, 32, 64, 128), (False, True), (True, False)))


@pytest.mark.parametrize(("bits", "group_size", "act_order", "sym"), COMBOS)
def test_repack_then_unpack_is_the_identity_and_dequantizes_bit_equal(bits, group_size, act_order, sym):
    weight, q = _weight(bits, group_size, sym, act_order)
    assert marlin_unsupported_reason(weight) is None
    marlin = repack(weight, torch.float16)
    pack = 32 // bits
    assert tuple(marlin.qweight.shape) == (256 // 16, 128 * 16 // pack)
    assert (marlin.zeros is None) == sym
    assert (marlin.perm is not None) == (act_order and group_size != -1)
    if marlin.perm is not None:
        assert bool((marlin.g_idx[1:] >= marlin.g_idx[:-1]).all())  # sorted for the kernel
    back = unpack(marlin)
    assert torch.equal(back.codes, weight.codes)
    assert torch.equal(back.zeros, weight.zeros)
    assert torch.equal(back.g_idx, weight.g_idx)
    assert torch.equal(back.scales, weight.scales)  # float16 scales survive the float16 layout
    assert torch.equal(back.dequantize(), dequantize(q))


def test_the_layout_really_moves_codes_and_permutes_scales_within_runs_of_64_columns():
    weight, _ = _weight(4, 128, False, False)
    marlin = repack(weight)
    tiles = weight.codes.to(torch.int64).reshape(16, 16, 8, 16).permute(0, 2, 1, 3).reshape(16, -1)
    assert not torch.equal(marlin.qweight, pack_int32(tiles, 4, 1))  # the fragment order is applied
    assert not torch.equal(marlin.scales.float(), weight.scales)
    runs = marlin.scales.float().reshape(-1, 64).sort(1).values
    assert torch.equal(runs, weight.scales.reshape(-1, 64).sort(1).values)


@pytest.mark.parametrize(("change", "reason"), [
    (dict(k=192, group_size=64), "Marlin needs input features a multiple of 128, found 192"),
    (dict(n=96), "Marlin needs output features a multiple of 64, found 96"),
    (dict(k=320), "Marlin cannot take a partial last group (320 input rows in groups of 128)"),
    (dict(group_size=256), "Marlin takes group sizes [-1, 32, 64, 128], not 256"),
    (dict(sym=False, zeros=lambda z: torch.where(torch.arange(z.numel()).reshape(z.shape) == 0, 16, z)),
     "a zero point outside [0, 16) (a GPTQ v1 zero of 0 wraps) cannot be stored for Marlin"),
])
def test_weights_marlin_cannot_take_are_named_with_the_reason(change, reason):
    args = dict(bits=4, group_size=128, sym=True, act_order=False)
    args.update(change)
    weight, _ = _weight(**args)
    assert marlin_unsupported_reason(weight) == reason
    with pytest.raises(ValueError, match=reason.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        repack(weight)


def test_unsupported_bits_are_named():
    weight, _ = _weight(4, 128, True, False)
    three = QuantizedWeight(weight.codes, weight.scales, weight.zeros, weight.g_idx, 3, 128)
    assert marlin_unsupported_reason(three) == "Marlin takes 4- or 8-bit weights, not 3-bit"
