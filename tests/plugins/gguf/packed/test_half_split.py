"""GGML's half-split Q4_0/Q4_1 codes packed straight into torch's int4 layout: the bytes ``pack_int4`` writes."""

from __future__ import annotations

import itertools

import pytest
import torch

from tests.core.test_kernels_int4_cpu import _reference_int4pack


@pytest.mark.parametrize("block_n", [32, 64])
@pytest.mark.parametrize(("n", "splits"), [
    (16, ()), (48, ()), (80, ()),
    (80, (64,)),  # a fused layer's parts on block boundaries (64-row blocks): copied straight into place
    (80, (32,)),  # on 32-row boundaries only
    (144, (16, 80)),  # inside blocks: concatenated first
    (160, (64, 128)),  # the tail in the last part
])
def test_half_split_packing_builds_both_row_blocks_of_torch_s_layout(n, splits, block_n, packing):
    """GGUF's half-split nibbles (column p low, p + 16 high) to either layout, from strided views of blocks,
    the rows whole or in parts (a fused layer's q/k/v) split anywhere."""
    from loader_plugin_gguf.packed.half_split import _int4pack_from_half_split

    generator = torch.Generator().manual_seed(n + block_n)
    qs = torch.randint(0, 256, (n, 2, 20), dtype=torch.uint8, generator=generator)[:, :, 4:]
    codes = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 64)
    edges = (0, *splits, n)
    parts = [qs[a:b] for a, b in itertools.pairwise(edges)]
    assert torch.equal(_int4pack_from_half_split(parts, block_n), _reference_int4pack(codes, block_n))


@pytest.mark.parametrize("n", [16, 48, 64, 80, 144, 256])
def test_half_split_packing_gives_the_same_weight_as_packing_the_codes(n, packing):
    """Codes still two per byte (GGML's order: column p low, p + 16 high) pack to pack_int4's bytes and scales."""
    from loader.kernels import pack_int4
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split

    generator = torch.Generator().manual_seed(n)
    blocks = torch.randint(0, 256, (n, 3, 20), dtype=torch.uint8, generator=generator)
    qs = blocks[:, :, 4:]  # strided, as a view into GGUF blocks is
    codes = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 96)
    scales, biases = torch.rand(3, n, generator=generator), torch.rand(3, n, generator=generator)
    expected = pack_int4(codes, scales, biases, 32)
    got = pack_int4_half_split(qs, scales, biases)
    assert got.packed and torch.equal(got.data, expected.data)
    assert torch.equal(got.scales_and_zeros, expected.scales_and_zeros)
    x = torch.randn(2, 96, generator=generator).to(torch.bfloat16)
    assert torch.equal(got.matmul(x), expected.matmul(x))


def test_half_split_packing_rejects_groups_that_are_not_32_columns():
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split

    qs = torch.zeros(16, 2, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"half-split codes \(16, 2, 8\) do not hold groups of 32 columns"):
        pack_int4_half_split(qs, torch.ones(2, 16), torch.zeros(2, 16))


def test_half_split_parts_must_share_their_columns_and_match_the_scales():
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split_parts

    q, k = torch.zeros(32, 2, 16, dtype=torch.uint8), torch.zeros(16, 3, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"half-split parts \[\(32, 2, 16\), \(16, 3, 16\)\] do not share "
                                         r"\[rows, groups, 16\] columns"):
        pack_int4_half_split_parts([q, k], torch.zeros(2, 48, 2))
    with pytest.raises(ValueError, match=r"scales and zeros \(2, 32, 2\) do not match 2 half-split parts of 48 "
                                         r"rows and 2 groups"):
        pack_int4_half_split_parts([q, q[:16]], torch.zeros(2, 32, 2))


def test_half_split_parts_give_the_weight_of_the_concatenated_rows(packing):
    """A fused layer's parts packed in place are the concatenated rows packed whole, unsupported shapes included."""
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split, pack_int4_half_split_parts

    generator = torch.Generator().manual_seed(3)
    for rows in ((64, 32, 32), (24, 8)):  # parts on the row blocks, and parts cutting one
        qs = torch.randint(0, 256, (sum(rows), 3, 16), dtype=torch.uint8, generator=generator)
        scales = torch.rand(3, sum(rows), generator=generator)
        biases = torch.randn(3, sum(rows), generator=generator)
        whole = pack_int4_half_split(qs, scales, biases)
        parts = list(qs.split(rows))
        got = pack_int4_half_split_parts(parts, whole.scales_and_zeros)
        assert torch.equal(got.data, whole.data) and got.reason == whole.reason
    odd = torch.randint(0, 256, (20, 3, 16), dtype=torch.uint8, generator=generator)  # 20 rows: not a multiple of 16
    sz = torch.zeros(3, 20, 2, dtype=torch.bfloat16)
    unpacked = pack_int4_half_split_parts([odd[:12], odd[12:]], sz)
    assert unpacked.reason == "output features 20 are not a multiple of 16"
    assert torch.equal(unpacked.data, torch.cat((odd & 0x0F, odd >> 4), dim=2).reshape(20, 96))


@pytest.mark.parametrize("rows", [(64, 32, 32), (64, 48, 16), (24, 8), (160,)])
def test_half_split_parts_in_their_own_row_order_are_those_rows_packed(packing, rows):
    """``row_orders`` (llama.cpp's interleaved q/k rows): the weight of ``part[order]`` for each part, whether
    the parts fill whole row blocks, cut one, or end in a partial block; a last part in stored order beside them."""
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split_parts

    generator = torch.Generator().manual_seed(sum(rows))
    parts, orders = [], []
    for index, n in enumerate(rows):
        if index == len(rows) - 1 and len(rows) > 1:
            parts.append(torch.randint(0, 256, (n, 3, 16), dtype=torch.uint8, generator=generator))
            orders.append(None)
        else:  # more rows stored than the part holds (a rank's window), picked in shuffled order
            parts.append(torch.randint(0, 256, (n + 8, 3, 16), dtype=torch.uint8, generator=generator))
            orders.append(torch.randperm(n + 8, generator=generator)[:n])
    sz = torch.rand(3, sum(rows), 2, generator=generator).to(torch.bfloat16)
    copied = [part if order is None else part.index_select(0, order)
              for part, order in zip(parts, orders, strict=True)]
    got = pack_int4_half_split_parts(parts, sz, orders)
    expected = pack_int4_half_split_parts(copied, sz)
    assert torch.equal(got.data, expected.data) and got.reason == expected.reason


def test_row_orders_must_match_the_parts():
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split_parts

    q = torch.zeros(32, 2, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="1 row orders for 2 half-split parts"):
        pack_int4_half_split_parts([q, q], torch.zeros(2, 64, 2), [None])
