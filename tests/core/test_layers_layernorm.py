"""RMSNorm against transformers' LlamaRMSNorm, including the bf16 cast order."""

from __future__ import annotations

import pytest
import torch

from loader.errors import ShapeMismatchError
from loader.layers import RMSNorm
from loader.layers.param_layout import weight_loader_of
from loader.weights import EagerTensor

modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")


@pytest.mark.parametrize("shape", [(2, 5, 16), (1, 1, 576), (1, 37, 4096)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_matches_llama_rmsnorm(dtype, shape):
    """Bit for bit: float32 runs through ``torch.nn.functional.rms_norm`` (one call instead of six), bfloat16
    through the explicit steps that cast before the weight multiplies."""
    gen = torch.Generator().manual_seed(0)
    hidden = shape[-1]
    weight = torch.randn(hidden, generator=gen).to(dtype)
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    ours = RMSNorm(hidden, eps=1e-5, params_dtype=dtype)
    weight_loader_of(ours.weight)(ours.weight, EagerTensor(weight))
    ref = modeling_llama.LlamaRMSNorm(hidden, eps=1e-5).to(dtype)
    ref.weight.data.copy_(weight)
    out = ours(x)
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref(x), rtol=0, atol=0)


def test_residual_form_adds_then_normalises():
    norm = RMSNorm(8)
    x, residual = torch.randn(3, 8), torch.randn(3, 8)
    normed, summed = norm(x, residual)
    torch.testing.assert_close(summed, x + residual)
    torch.testing.assert_close(normed, norm(x + residual))


def test_weight_loader_checks_shape():
    norm = RMSNorm(8)
    bad = EagerTensor(torch.ones(9), "model.norm.weight", "m.safetensors")
    with pytest.raises(ShapeMismatchError,
                       match=r"'model.norm.weight' in m.safetensors: expected shape \(8,\), found \(9,\)"):
        weight_loader_of(norm.weight)(norm.weight, bad)
