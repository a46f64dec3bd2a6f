"""``loader.layers.pack_int4``: torch's packed int4 CPU matmul for any affine 4-bit weight, and its refusals."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from loader.layers import int4_unsupported_reason, pack_int4


def test_the_int4_wrapper_takes_any_affine_4bit_weight_and_explains_what_it_refuses():
    """GGUF Q4_1-like weights (``w = q * d + m``) through the format-independent interface."""
    gen = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (32, 128), generator=gen)
    d, m = torch.rand(4, 32, generator=gen), torch.randn(4, 32, generator=gen)
    reference = codes.float() * d.repeat_interleave(32, 0).t() + m.repeat_interleave(32, 0).t()
    x = torch.randn(3, 128, generator=gen)
    packed = pack_int4(codes, d, m, 32, torch.float32)
    assert packed.packed and packed.reason is None
    assert float((packed.matmul(x) - x @ reference.t()).norm() / (x @ reference.t()).norm()) <= 1e-5
    unpacked = pack_int4(codes[:24], d[:, :24], m[:, :24], 32, torch.float32)
    assert unpacked.reason == "output features 24 are not a multiple of 16"
    assert torch.allclose(unpacked.dequantize(), reference[:24], atol=1e-5)
    assert int4_unsupported_reason(64, 128, 16) == "group size 16 is not one of the int4 kernel's [32, 64, 128, 256]"
    assert int4_unsupported_reason(64, 96, 64) == "input features 96 are not a multiple of the group size 64"
    with pytest.raises(ValueError, match="do not describe groups of 32 input columns"):
        pack_int4(codes, d[:3], m[:3], 32)
    with pytest.raises(ValueError, match="packed int4 layout cannot be dequantized"):
        packed.dequantize()


def _reference_int4pack(codes: torch.Tensor, block_n: int) -> torch.Tensor:
    """torch's CPU int4 layout from its definition, one row block at a time (codes ``[N, K]``)."""
    n, k = codes.shape
    full = n // block_n * block_n
    pieces = []
    for start in range(0, full, block_n):
        block = codes[start:start + block_n].to(torch.uint8)
        pieces.append((block[: block_n // 2] | (block[block_n // 2:] << 4)).t().reshape(-1))
    if full < n:
        tail = codes[full:].to(torch.uint8)
        pieces.append((tail[0::2] | (tail[1::2] << 4)).t().reshape(-1))
    return torch.cat(pieces).reshape(n, k // 2)


@pytest.mark.parametrize("block_n", [64, 32])
@pytest.mark.parametrize("n", [16, 48, 64, 80, 144, 256])
def test_the_byte_level_packing_builds_both_row_blocks_of_torch_s_layout(n, block_n):
    """Blocks of 64 rows (AVX-512 builds) and of 32 (AVX2), whichever this machine runs."""
    from loader.layers.int4_cpu import pack_codes_bytes

    codes = torch.randint(0, 16, (96, n), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))  # [K, N]
    assert torch.equal(pack_codes_bytes(codes.t(), block_n), _reference_int4pack(codes.t(), block_n))


def test_the_byte_level_packing_knows_this_cpu_s_torch_layout():
    """torch lays int4 rows out in blocks of 64 on AVX512 and of 32 on AVX2 (an AMD EPYC without AVX512 here)."""
    from loader.layers.int4_cpu import torch_int4_block_n

    capability = torch.backends.cpu.get_cpu_capability()
    expected = {"AVX512": 64, "AVX2": 32}.get(capability)
    if expected is None:
        pytest.skip(f"torch dispatches to {capability}: its int4 layout is packed by torch's own op")
    assert torch_int4_block_n() == expected


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
    from loader.layers.int4_cpu import _int4pack_from_half_split

    generator = torch.Generator().manual_seed(n + block_n)
    qs = torch.randint(0, 256, (n, 2, 20), dtype=torch.uint8, generator=generator)[:, :, 4:]
    codes = torch.cat((qs & 0x0F, qs >> 4), dim=2).reshape(n, 64)
    edges = (0, *splits, n)
    parts = [qs[a:b] for a, b in itertools.pairwise(edges)]
    assert torch.equal(_int4pack_from_half_split(parts, block_n), _reference_int4pack(codes, block_n))


@pytest.mark.parametrize("n", [16, 48, 64, 80, 144, 256])
def test_the_byte_level_packing_gives_torch_s_own_int4_layout(n):
    """pack_int4 builds this machine's torch layout with byte operations (no int32 copy of the codes): on AVX2
    (32-row blocks) it used to fall back to the op, whose int32 copy made a 1 GB model's load peak 0.3 GiB higher."""
    from loader.layers.int4_cpu import torch_int4_block_n

    assert torch_int4_block_n() in (64, 32)
    codes = torch.randint(0, 16, (96, n), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))  # [K, N]
    expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.t().to(torch.int32).contiguous(), 1)
    assert torch.equal(pack_int4(codes.t(), torch.ones(3, n), torch.zeros(3, n), 32).data, expected)


@pytest.mark.parametrize("n", [16, 48, 64, 80, 144, 256])
def test_half_split_packing_gives_the_same_weight_as_packing_the_codes(n, packing):
    """Codes still two per byte (GGML's order: column p low, p + 16 high) pack to pack_int4's bytes and scales."""
    from loader.layers import pack_int4, pack_int4_half_split

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
    from loader.layers import pack_int4_half_split

    qs = torch.zeros(16, 2, 8, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"half-split codes \(16, 2, 8\) do not hold groups of 32 columns"):
        pack_int4_half_split(qs, torch.ones(2, 16), torch.zeros(2, 16))


def test_half_split_parts_must_share_their_columns_and_match_the_scales():
    from loader.layers import pack_int4_half_split_parts

    q, k = torch.zeros(32, 2, 16, dtype=torch.uint8), torch.zeros(16, 3, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"half-split parts \[\(32, 2, 16\), \(16, 3, 16\)\] do not share "
                                         r"\[rows, groups, 16\] columns"):
        pack_int4_half_split_parts([q, k], torch.zeros(2, 48, 2))
    with pytest.raises(ValueError, match=r"scales and zeros \(2, 32, 2\) do not match 2 half-split parts of 48 "
                                         r"rows and 2 groups"):
        pack_int4_half_split_parts([q, q[:16]], torch.zeros(2, 32, 2))


def test_half_split_parts_give_the_weight_of_the_concatenated_rows(packing):
    """A fused layer's parts packed in place are the concatenated rows packed whole, unsupported shapes included."""
    from loader.layers import pack_int4_half_split, pack_int4_half_split_parts

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
    from loader.layers import pack_int4_half_split_parts

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
    from loader.layers import pack_int4_half_split_parts

    q = torch.zeros(32, 2, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="1 row orders for 2 half-split parts"):
        pack_int4_half_split_parts([q, q], torch.zeros(2, 64, 2), [None])


def test_the_packed_layout_fingerprint_changes_with_torch_the_layout_or_the_code(monkeypatch, tmp_path):
    from loader.layers import int4_cpu, packed_layout_fingerprint

    fingerprint = packed_layout_fingerprint()
    assert len(fingerprint) == 64 and fingerprint == int4_cpu.packed_layout_fingerprint.__wrapped__()
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert int4_cpu.packed_layout_fingerprint.__wrapped__() != fingerprint
    monkeypatch.undo()
    other = 32 if int4_cpu.torch_int4_block_n() != 32 else 64
    monkeypatch.setattr(int4_cpu, "torch_int4_block_n", lambda: other)
    assert int4_cpu.packed_layout_fingerprint.__wrapped__() != fingerprint
    monkeypatch.undo()
    # an edited packer: the same module files read from a copy with one byte changed
    for name in ("int4_cpu.py", "int8_cpu.py", "native_packing.py", "native_packing.c"):
        (tmp_path / name).write_bytes((Path(int4_cpu.__file__).parent / name).read_bytes())
    (tmp_path / "native_packing.c").write_bytes((tmp_path / "native_packing.c").read_bytes() + b"\n")
    monkeypatch.setattr(int4_cpu, "__file__", str(tmp_path / "int4_cpu.py"))
    assert int4_cpu.packed_layout_fingerprint.__wrapped__() != fingerprint
