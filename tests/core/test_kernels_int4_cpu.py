"""``loader.kernels.pack_int4``: torch's packed int4 CPU matmul for any affine 4-bit weight, and its refusals."""

from __future__ import annotations

import pytest
import torch

from loader.kernels import int4_unsupported_reason, pack_int4


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
    # packed codes are read back from torch's layout: the dequantize path multiplies this weight
    assert torch.allclose(packed.dequantize(), reference, atol=1e-5)
    assert torch.equal(packed.dequantize(torch.bfloat16), packed.dequantize().to(torch.bfloat16))


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
    from loader.kernels.int4_layout import pack_codes_bytes

    codes = torch.randint(0, 16, (96, n), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))  # [K, N]
    assert torch.equal(pack_codes_bytes(codes.t(), block_n), _reference_int4pack(codes.t(), block_n))


def test_the_byte_level_packing_knows_this_cpu_s_torch_layout():
    """torch lays int4 rows out in blocks of 64 on AVX512 and of 32 on AVX2 (an AMD EPYC without AVX512 here)."""
    from loader.kernels.int4_layout import torch_int4_block_n

    capability = torch.backends.cpu.get_cpu_capability()
    expected = {"AVX512": 64, "AVX2": 32}.get(capability)
    if expected is None:
        pytest.skip(f"torch dispatches to {capability}: its int4 layout is packed by torch's own op")
    assert torch_int4_block_n() == expected


@pytest.mark.parametrize("n", [16, 48, 64, 80, 144, 256])
def test_the_byte_level_packing_gives_torch_s_own_int4_layout(n):
    """pack_int4 builds this machine's torch layout with byte operations (no int32 copy of the codes): on AVX2
    (32-row blocks) it used to fall back to the op, whose int32 copy made a 1 GB model's load peak 0.3 GiB higher."""
    from loader.kernels.int4_layout import torch_int4_block_n

    assert torch_int4_block_n() in (64, 32)
    codes = torch.randint(0, 16, (96, n), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))  # [K, N]
    expected = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.t().to(torch.int32).contiguous(), 1)
    assert torch.equal(pack_int4(codes.t(), torch.ones(3, n), torch.zeros(3, n), 32).data, expected)
