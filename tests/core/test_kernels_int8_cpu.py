"""``loader.kernels.pack_int8_grouped``: an int8 weight, a scale per 32 columns, as two int4 planes of torch's
kernel."""

from __future__ import annotations

import pytest
import torch

from loader.kernels import Int4CpuWeight, int8_grouped_unsupported_reason, pack_int4, pack_int8_grouped
from loader.kernels.int4_layout import torch_int4_block_n, unpack_int4_rows


def _weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes ``[N, K / 32, 32]`` over the whole range (both edges included) and positive scales ``[K / 32, N]``."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(-128, 128, (n, k // 32, 32), dtype=torch.int8, generator=gen)
    codes[0, 0, :2] = torch.tensor([-128, 127], dtype=torch.int8)
    return codes, torch.rand(k // 32, n, generator=gen) / 64 + 1e-4


def _dense(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``codes * scales`` with the scales rounded to ``dtype``, in float64 ``[N, K]``."""
    n = codes.shape[0]
    rounded = scales.to(dtype).to(torch.float64).t()  # [N, K / 32]
    return (codes.to(torch.float64) * rounded[..., None]).reshape(n, -1)


@pytest.mark.parametrize("n", [64, 192, 80, 16])  # whole 64-row blocks (the word-wide path) and a tail
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_each_output_is_the_exact_product_rounded_once_per_plane(n, dtype, packing):
    """Every output is within the two planes' roundings to ``dtype`` of the float64 product of the
    rounded-scale weight: the kernel multiplies ``c * s`` exactly, not a rounded dequantization."""
    codes, scales = _weight(n, 256, seed=n)
    weight = pack_int8_grouped(codes, scales, dtype)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(1)).to(dtype)
    got = weight.matmul(x)
    assert got.dtype == torch.float32 and got.shape == (5, n)
    dense = _dense(codes, scales, dtype)
    x64 = x.to(torch.float64)
    expected = x64 @ dense.t()
    high = x64 @ (dense - _dense(codes.to(torch.int16).remainder(16).to(torch.int8), scales, dtype)).t()
    ulp = torch.finfo(dtype).eps  # each plane's sum is rounded to dtype once: half an ulp of each, and some slack
    bound = (high.abs() + (expected - high).abs()) * ulp + 1e-6
    assert bool(((got.to(torch.float64) - expected).abs() <= bound).all())


def test_the_planes_give_the_int8_kernel_s_logits_for_a_q8_0_like_table():
    """Against torch's int8 kernel run once per 32-column block (what a Q8_0 head did before): same weights."""
    codes, scales = _weight(128, 128, seed=3)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    per_block = sum(
        torch.ops.aten._weight_int8pack_mm(x[:, 32 * g:32 * g + 32].contiguous(), codes[:, g].contiguous(),
                                           scales[g].to(torch.bfloat16)).to(torch.float32)
        for g in range(4))
    got = pack_int8_grouped(codes, scales).matmul(x)
    assert float((got - per_block).norm() / per_block.norm()) <= 4e-3


@pytest.mark.parametrize("n", [128, 80])
def test_the_codes_read_back_from_the_planes_are_the_codes_packed(n, packing):
    codes, scales = _weight(n, 96, seed=n)
    weight = pack_int8_grouped(codes, scales)
    rows = torch.tensor([0, n - 1, 5, 5, n // 2, 63 % n, 64 % n])
    assert weight.codes(rows).dtype == torch.int8
    assert torch.equal(weight.codes(rows), codes.reshape(n, -1)[rows])
    assert torch.equal(weight.codes(torch.arange(n)), codes.reshape(n, -1))


def test_a_strided_view_of_block_bytes_packs_like_its_copy(packing):
    """GGUF Q8_0 blocks are 2 bytes of scale then 32 codes: the codes are a strided uint8 view."""
    codes, scales = _weight(64, 64, seed=7)
    blocks = torch.zeros(64, 2, 34, dtype=torch.uint8)
    blocks[:, :, 2:] = codes.view(torch.uint8)
    view = blocks[:, :, 2:]
    assert not view.is_contiguous()
    assert torch.equal(pack_int8_grouped(view, scales).planes.data, pack_int8_grouped(codes, scales).planes.data)


@pytest.mark.parametrize("n", [16, 48, 64, 80, 144])
def test_rows_unpacked_from_torch_s_int4_layout_are_the_codes_packed(n):
    codes = torch.randint(0, 16, (n, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(n))
    packed = pack_int4(codes, torch.ones(2, n), torch.zeros(2, n), 32)
    assert packed.packed
    rows = torch.arange(n).flip(0)
    assert torch.equal(unpack_int4_rows(packed.data, rows), codes[rows])


def test_what_the_planes_refuse_is_named():
    assert torch_int4_block_n() is not None  # this machine's torch: the planes can be read back
    assert int8_grouped_unsupported_reason(24, 64) == "output features 24 are not a multiple of 16"
    codes, scales = _weight(24, 64)
    with pytest.raises(ValueError, match="output features 24 are not a multiple of 16"):
        pack_int8_grouped(codes, scales)
    with pytest.raises(ValueError, match=r"int8 codes \(16, 2, 32\) and scales \(1, 16\) do not describe groups"):
        pack_int8_grouped(codes[:16], scales[:1, :16])
    with pytest.raises(ValueError, match="do not describe groups of 32 input columns"):
        pack_int8_grouped(codes.reshape(24, 4, 16), scales)
    assert isinstance(pack_int8_grouped(codes[:16], scales[:, :16]).planes, Int4CpuWeight)


def test_a_torch_whose_int4_layout_is_unknown_is_refused_by_name(monkeypatch):
    """Another torch build may lay int4 rows out differently: the planes could not be read back, so they are refused."""
    import loader.kernels.int4_layout as int4_cpu
    import loader.kernels.int8_cpu as int8_cpu

    monkeypatch.setattr(int8_cpu, "torch_int4_block_n", lambda: None)
    monkeypatch.setattr(int4_cpu, "torch_int4_block_n", lambda: None)
    message = "this torch's packed int4 layout is not one loader can read rows back from"
    assert int8_grouped_unsupported_reason(64, 64) == message
    codes, scales = _weight(64, 64)
    with pytest.raises(ValueError, match=message):
        pack_int8_grouped(codes, scales)
    with pytest.raises(ValueError, match=message):
        unpack_int4_rows(torch.zeros(64, 32, dtype=torch.uint8), torch.tensor([0]))
