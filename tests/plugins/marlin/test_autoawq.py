"""AutoAWQ (GEMM) against the packer and the loader.

Skipped where AutoAWQ is not installed (``pip install -c constraints.txt autoawq``; tox env
``marlin-autoawq``). AutoAWQ's quantize-and-pack code runs on the CPU (see
``tests/helpers/autoawq_checkpoints.py`` for which parts are used). Two checks:

* the packer's AWQ bytes (``qweight``, ``qzeros``, ``scales``) equal ``WQLinear_GEMM.from_linear``'s for
  the same inputs: AutoAWQ's own quantization (its fake-quantized weight, scales and zeros). From the float
  weight alone the two do not agree bit for bit: AutoAWQ quantizes in float16 arithmetic, the packer in
  float32, so about 0.1 % of codes (those at a rounding boundary) differ;
* checkpoints AutoAWQ packed load, and their logits match a model built from AutoAWQ's own
  ``dequantize_gemm`` within 1e-3 relative (float32; ``dequantize_gemm`` computes in float16, so the
  weight loader dequantizes, rounded to float16, is compared bit for bit).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("awq", reason="AutoAWQ is not installed: tox -e marlin-autoawq")

import loader
from loader_plugin_marlin.linear_method import PackedLinearMethod
from tests.helpers.autoawq_checkpoints import (
    autoawq_dequantized_weights,
    awq_linear,
    awq_quantize,
    reference_from_autoawq,
    save_autoawq_checkpoint,
)
from tests.helpers.awq_checkpoints import awq_tensors
from tests.helpers.gptq_checkpoints import make_g_idx, quantize_with
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_packer_writes_autoawq_s_bytes(group_size, seed):
    n, k = 96, 256
    weight = (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05).to(torch.float16)
    linear = torch.nn.Linear(k, n, bias=False)
    linear.weight.data = weight.clone()
    theirs = awq_linear(linear, group_size)
    fake, scales, zeros = awq_quantize(weight, group_size)
    q = quantize_with(fake.float(), scales, zeros.to(torch.int32), make_g_idx(k, group_size, False), 4)
    mine = awq_tensors(q)
    for name in ("qweight", "qzeros", "scales"):
        expected = getattr(theirs, name)
        assert mine[name].dtype == expected.dtype, name
        assert torch.equal(mine[name], expected), f"{name} differs in {int((mine[name] != expected).sum())} places"


CASES = {
    "llama-g32": ("llama", 32),
    "llama-g64": ("llama", 64),
    "qwen2-g128": ("qwen2", 128),
}
SIZES = dict(hidden_size=128, intermediate_size=256)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.mark.parametrize("case", list(CASES))
def test_autoawq_checkpoints_load_as_its_own_dequantization(case, tmp_path):
    family, group_size = CASES[case]
    path = save_autoawq_checkpoint(family, tmp_path / case, group_size=group_size, **SIZES)
    weights = autoawq_dequantized_weights(path)
    assert len(weights) == 14

    model, report = loader.load_model_with_report(str(path), dtype="float32",
                                                  quantization_options={"kernel": "dequantize"})
    assert report.quantization["group_size"] == group_size
    layers = {name: module for name, module in model.named_modules()
              if isinstance(getattr(module, "quant_method", None), PackedLinearMethod)}
    assert len(layers) == 8
    for name, layer in layers.items():
        parent, _, leaf = name.rpartition(".")
        expected = torch.cat([weights[f"{parent}.{part}"] for part in FUSED.get(leaf, (leaf,))])
        mine = layer.quant_method.kernel(layer).weight.dequantize()
        assert torch.equal(mine.to(torch.float16).to(torch.float32), expected), name

    reference = reference_from_autoawq(family, path, weights, **SIZES)
    packed, packed_report = loader.load_model_with_report(str(path), dtype="float32")
    ids = random_ids(reference.config.vocab_size, seq=24)
    with torch.no_grad():
        error = relative_error(packed(ids), reference_logits(reference, ids))
    print(f"{case}: relative error {error:.3g} against AutoAWQ's dequantize_gemm; "
          f"kernels {packed_report.quantization['kernels']}")
    assert error <= 1e-3
