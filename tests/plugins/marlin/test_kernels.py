"""Each CPU kernel against the reference dequantization, and the per-layer fallback with its reason."""

from __future__ import annotations

import itertools

import attrs
import pytest
import torch

from loader.kernels import KernelChoice
from loader_plugin_marlin.gptq_format import gptq_to_quantized
from loader_plugin_marlin.kernels import choose_kernel, kernel_group
from tests.helpers.gptq_checkpoints import dequantize, pack_gptq, quantize


def _weight(bits, group_size, sym, act_order, n=48, k=160):
    q = quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(3)), bits, group_size, sym=sym,
                 act_order=act_order)
    t = pack_gptq(q, checkpoint_format="gptq_v2")
    return gptq_to_quantized(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits=bits, group_size=group_size,
                             zeros_minus_one=False), dequantize(q)


def _error(kernel, reference, dtype):
    x = torch.randn(5, reference.shape[1], generator=torch.Generator().manual_seed(4))
    expected = x @ reference.t()
    actual = kernel.matmul(x.to(dtype)).float()
    return float((actual - expected).norm() / expected.norm())


# K = 160 with groups of 64/128: a partial last group, tiled by the kernel's group of 32.
@pytest.mark.parametrize(("group_size", "sym", "act_order"),
                         list(itertools.product((-1, 32, 64, 128), (True, False), (False, True))))
def test_int4_kernel_matches_the_reference_in_float32_and_bfloat16(group_size, sym, act_order):
    weight, reference = _weight(4, group_size, sym, act_order)
    for dtype, tolerance in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        kernel = choose_kernel(weight, "auto", dtype)
        assert kernel.choice.kernel == "int4pack", kernel.choice
        assert _error(kernel, reference, dtype) <= tolerance


@pytest.mark.parametrize(("sym", "act_order"), list(itertools.product((True, False), (False, True))))
def test_int8_kernel_takes_channelwise_weights_symmetric_or_not(sym, act_order):
    weight, reference = _weight(8, -1, sym, act_order)
    kernel = choose_kernel(weight, "auto", torch.float32)
    assert kernel.choice.kernel == "int8pack"
    assert _error(kernel, reference, torch.float32) <= 1e-5


@pytest.mark.parametrize(("bits", "group_size", "n", "kernel", "reason"), [
    (8, 32, 48, "auto", "8-bit with 5 groups: the int8 kernel takes one scale per output channel"),
    (4, 32, 40, "auto", "output features 40 are not a multiple of 16"),
    (4, 32, 48, "int8pack", "the int8pack kernel does not take 4-bit weights"),
    (4, 32, 48, "dequantize", "quantization_options kernel='dequantize'"),
])
def test_layers_a_kernel_cannot_take_fall_back_to_the_reference_with_the_reason(bits, group_size, n, kernel,
                                                                                  reason):
    weight, reference = _weight(bits, group_size, True, False, n=n)
    chosen = choose_kernel(weight, kernel, torch.float32)
    assert chosen.choice.kernel == "dequantize"
    assert chosen.choice.reason == reason
    assert _error(chosen, reference, torch.float32) <= 1e-6


def test_groups_no_kernel_group_tiles_are_padded_with_rows_that_read_zero():
    weight, reference = _weight(4, 16, False, False, k=48)  # groups of 16: no kernel group size fits
    assert kernel_group(weight.g_idx) is None
    chosen = choose_kernel(weight, "auto", torch.float32)
    assert chosen.choice == KernelChoice("int4pack") and chosen.padded
    assert _error(chosen, reference, torch.float32) <= 1e-5


def test_a_rank_s_share_of_act_order_rows_stays_packed():
    """Row-parallel TP with act-order: this rank's rows use every group, each only partly."""
    whole, _ = _weight(4, 32, False, True, k=256)
    rows = slice(128, 256)
    share = attrs.evolve(whole, codes=whole.codes[rows], g_idx=whole.g_idx[rows])
    assert kernel_group(torch.sort(share.g_idx).values) is None
    chosen = choose_kernel(share, "auto", torch.float32)
    assert chosen.choice.kernel == "int4pack"
    assert _error(chosen, share.dequantize(), torch.float32) <= 1e-5


def test_kernel_group_is_the_largest_that_stays_inside_one_checkpoint_group():
    assert kernel_group(torch.arange(576) // 128) == 64  # 4 groups of 128 and one of 64
    assert kernel_group(torch.arange(512) // 128) == 128
    assert kernel_group(torch.zeros(768, dtype=torch.int64)) == 256


def test_a_layer_the_int4_kernel_refuses_is_not_prepared_for_it(monkeypatch):
    """The reason is known from the shapes: no sorted, padded or packed copy of the codes is made first."""
    import loader_plugin_marlin.kernels as kernels

    def refuse(*args, **kwargs):
        raise AssertionError("pack_int4 ran for a layer the int4 kernel cannot take")

    monkeypatch.setattr(kernels, "pack_int4", refuse)
    weight, reference = _weight(4, 32, True, True, n=40)  # N = 40: not a multiple of 16
    chosen = choose_kernel(weight, "auto", torch.float32)
    assert chosen.choice == KernelChoice("dequantize", "output features 40 are not a multiple of 16")
    assert _error(chosen, reference, torch.float32) <= 1e-6
