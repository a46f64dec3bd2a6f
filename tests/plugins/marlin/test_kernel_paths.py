"""The packed layers' path per activation dtype and tokens: the default float32 path and its tolerance, the
exact option, the plan from (injected) timings recorded per layer and per bucket, grouped int8 kernels in
float32, and the option's refusals.

The suite's conftest asks for exact float32 (``LOADER_KERNEL_EXACT_FLOAT32=1``) and the static rule
(``LOADER_KERNEL_MEASURE=0``); these tests turn either off where they check the default.
"""

from __future__ import annotations

import pytest
import torch

import loader
from loader.errors import ConfigError
from loader.kernels import PACKED_BF16_LOGITS_TOLERANCE, TOKEN_BUCKETS, kernel_timing, weight_paths
from loader_plugin_marlin.kernel_paths import DenseBudget, with_paths
from loader_plugin_marlin.kernels import choose_kernel
from loader_plugin_marlin.quantized_weight import QuantizedWeight, default_g_idx
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids

BUCKET_NAMES = ("1", "2-16", "17-64", "65-256", "257+")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("paths")
    return {name: save_gptq_checkpoint("llama", root / name, bits=bits, group_size=group, sym=sym)
            for name, bits, group, sym in (("w4-g32", 4, 32, True), ("w8-g32", 8, 32, False),
                                           ("w8-g64", 8, 64, True))}


@pytest.fixture
def default_float32(monkeypatch):
    """The user's default: float32 activations may be cast to bfloat16 for the packed kernel."""
    monkeypatch.setenv("LOADER_KERNEL_EXACT_FLOAT32", "0")


@pytest.mark.parametrize("case", ["w4-g32", "w8-g32", "w8-g64"])
def test_float32_by_default_runs_the_packed_kernel_on_bfloat16_activations_within_the_documented_tolerance(
        checkpoints, case, default_float32):
    """W4A16 and grouped W8A16 in float32: a real kernel (not dequantize-per-call), logits within tolerance."""
    path, reference = checkpoints[case]
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        error = relative_error(model(ids), reference_logits(reference, ids))
    assert 1e-6 < error <= PACKED_BF16_LOGITS_TOLERANCE, f"{case}: relative error {error:.3g}"
    record = report.quantization["layers"]["model.layers.0.mlp.down_proj"]
    assert record["kernel"] in ("int4pack", "int8planes", "int8groups")
    assert record["by_tokens"] == {"float32": dict.fromkeys(BUCKET_NAMES, "packed-bf16")}
    assert report.quantization["exact_float32"] is False


def test_exact_float32_keeps_float32_arithmetic(checkpoints, default_float32):
    path, reference = checkpoints["w4-g32"]
    model, report = loader.load_model_with_report(str(path), dtype="float32",
                                                  quantization_options={"exact_float32": True})
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(model(ids), reference_logits(reference, ids)) <= 1e-5
    record = report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]
    assert record["by_tokens"] == {"float32": dict.fromkeys(BUCKET_NAMES, "dequantize")}


def test_measured_timings_decide_each_bucket_and_the_report_records_them(checkpoints, monkeypatch, default_float32):
    """Timings injected in place of the machine's: packed-bf16 wins small calls, dequantize from 65 tokens on;
    a timing for a path this layer cannot run (``packed`` in float32 over a bfloat16 kernel) is ignored."""
    table = {bucket: {"packed-bf16": bucket * 1e-5, "dequantize": 5e-4 + bucket * 1e-6, "packed": 1e-9}
             for bucket in TOKEN_BUCKETS}
    measured: list[str] = []

    def fake_measure(paths, in_features, dtype, buckets=TOKEN_BUCKETS):
        measured.append(f"{in_features}:{dtype}")
        return table

    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "1")
    monkeypatch.setattr(kernel_timing, "measure_paths", fake_measure)
    monkeypatch.setattr(kernel_timing, "_memory", {})
    path, reference = checkpoints["w4-g32"]
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    expected = {"1": "packed-bf16", "2-16": "packed-bf16", "17-64": "packed-bf16", "65-256": "dequantize",
                "257+": "dequantize"}
    for prefix, record in report.quantization["layers"].items():
        assert record["by_tokens"] == {"float32": expected}, prefix
        assert record["paths_from"] == "measured"
    # one timing per layer kind (qkv, o, gate_up, down share K=64 slices of their rows), not per layer
    assert len(measured) < len(report.quantization["layers"])
    ran: list[str] = []
    run_path = weight_paths.run_path
    monkeypatch.setattr(weight_paths, "run_path", lambda w, p, x, d=None: ran.append(p) or run_path(w, p, x, d))
    ids = random_ids(reference.config.vocab_size)  # 2 x 12 tokens: packed-bf16; 128 tokens: dequantize
    long_ids = torch.randint(0, reference.config.vocab_size, (1, 128), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert relative_error(model(ids), reference_logits(reference, ids)) <= PACKED_BF16_LOGITS_TOLERANCE
        assert set(ran) == {"packed-bf16"}
        ran.clear()
        assert relative_error(model(long_ids), reference_logits(reference, long_ids)) <= PACKED_BF16_LOGITS_TOLERANCE
        assert set(ran) == {"dequantize"}


def _weight(bits: int, k: int, n: int, group: int) -> QuantizedWeight:
    generator = torch.Generator().manual_seed(k + n)
    groups = k // group
    return QuantizedWeight(
        codes=torch.randint(0, 1 << bits, (k, n), dtype=torch.uint8, generator=generator),
        scales=torch.rand(groups, n, generator=generator) / 100,
        zeros=torch.full((groups, n), 1 << (bits - 1), dtype=torch.int32),
        g_idx=default_g_idx(k, group), bits=bits, group_size=group)


def test_a_dense_copy_is_kept_only_within_the_budget(monkeypatch):
    """The static exact rule prefers the dense copy; the budget decides which layers get one."""
    weight = _weight(4, 128, 64, 32)
    kernel = choose_kernel(weight, "auto", torch.float32)
    size = 128 * 64 * 4
    budget = DenseBudget(size + 10)
    first = with_paths(kernel, torch.float32, exact=True, budget=budget)
    second = with_paths(kernel, torch.float32, exact=True, budget=budget)
    assert first.dense is not None and first.choice.paths[0].paths == ("dense",) * 5
    assert second.dense is None and second.choice.paths[0].paths == ("dequantize",) * 5
    assert budget.left == 10
    x = torch.randn(3, 128)
    expected = x @ weight.dequantize().t()
    for planned in (first, second):
        assert torch.allclose(planned.matmul(x), expected, atol=1e-5)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_a_bad_exact_float32_option_is_refused_with_its_value(checkpoints, bad):
    path, _ = checkpoints["w4-g32"]
    with pytest.raises(ConfigError, match=rf"quantization_options: exact_float32 must be true or false, "
                                          rf"found {bad!r}"):
        loader.load_model(str(path), dtype="float32", quantization_options={"exact_float32": bad})


def test_an_unknown_option_names_the_options_there_are(checkpoints):
    path, _ = checkpoints["w4-g32"]
    with pytest.raises(ConfigError, match=r"unknown gptq option\(s\) \['exact'\]; expected some of "
                                          r"\['kernel', 'exact_float32'\]"):
        loader.load_model(str(path), quantization_options={"exact": True})
