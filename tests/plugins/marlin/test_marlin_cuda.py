"""The Marlin kernel's availability, and (where CUDA 8.0+ and sgl-kernel exist) one GEMM against the reference."""

from __future__ import annotations

import pytest
import torch

from loader_plugin_marlin.kernels import choose_kernel
from loader_plugin_marlin.marlin_cuda import marlin_cuda_unavailable_reason
from tests.plugins.marlin.test_marlin_layout import _weight


def test_on_the_cpu_the_marlin_kernel_is_unavailable_with_the_reason():
    assert marlin_cuda_unavailable_reason(torch.device("cpu")) == "the Marlin kernel runs on CUDA devices, not cpu"
    weight, _ = _weight(4, 128, True, False)
    chosen = choose_kernel(weight, "marlin", torch.float16)
    assert chosen.choice.kernel == "dequantize"
    assert chosen.choice.reason == "the Marlin kernel runs on CUDA devices, not cpu"


def _cuda_ready() -> bool:
    return torch.cuda.is_available() and marlin_cuda_unavailable_reason(torch.device("cuda")) is None


@pytest.mark.skipif(not _cuda_ready(), reason="needs CUDA with compute capability 8.0+ and sgl-kernel")
@pytest.mark.parametrize(("bits", "group_size", "act_order", "sym"),
                         [(4, 128, False, True), (4, 128, True, True), (8, -1, False, True), (4, 64, False, False)])
def test_marlin_gemm_matches_the_dequantized_reference(bits, group_size, act_order, sym):  # pragma: no cover
    import attrs

    weight, _ = _weight(bits, group_size, sym, act_order)
    cuda = attrs.evolve(weight, codes=weight.codes.cuda(), scales=weight.scales.cuda(), zeros=weight.zeros.cuda(),
                        g_idx=weight.g_idx.cuda())
    kernel = choose_kernel(cuda, "auto", torch.float16)
    assert kernel.choice.kernel == "marlin", kernel.choice
    x = torch.randn(7, weight.in_features, dtype=torch.float16, device="cuda")
    expected = x.float() @ weight.dequantize().cuda().t()
    error = float((kernel.matmul(x).float() - expected).norm() / expected.norm())
    print(f"marlin {bits}-bit g{group_size} act_order={act_order} sym={sym}: relative error {error:.3g}")
    assert error <= 2e-3
