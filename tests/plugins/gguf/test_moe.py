"""Mixture-of-experts GGUFs written with gguf-py (:mod:`tests.helpers.gguf_moe_files`, laid out as the
converter lays them out): Q4_0/Q4_1/Q4_K/Q8_0 experts kept packed, two simulated ranks, and damaged files.

The files llama.cpp's converter writes itself are checked in ``test_moe_converted.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader.errors import ConfigError, ShapeMismatchError
from loader.layers import FusedMoE
from loader.testing import simulated_tp
from tests.helpers.gguf_files import Q
from tests.helpers.gguf_moe_files import write_moe_gguf
from tests.helpers.hf_checkpoints import build_model, reference_logits, relative_error, tiny_config

VOCAB = 288
QWEN2 = {"mlp_only_layers": [], "shared_expert_intermediate_size": 64, "moe_intermediate_size": 64}
QWEN3 = {"moe_intermediate_size": 64}
K_QUANT = {"hidden_size": 256, "head_dim": 64, "moe_intermediate_size": 256}  # 256-value super-blocks
PACKED_TOLERANCE = 2e-2  # the int4 kernel computes in bfloat16


@pytest.fixture(scope="module")
def moe_gguf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``moe_gguf(family, qtype, **overrides) -> (path, hf model)``, cached per module."""
    cache: dict[tuple[Any, ...], tuple[Path, Any]] = {}
    folder = tmp_path_factory.mktemp("moe-gguf")

    def make(family: str, qtype: Q = Q.F32, **overrides: Any) -> tuple[Path, Any]:
        key = (family, qtype, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in cache:
            model = build_model(family, tiny_config(family, vocab_size=VOCAB, **overrides))
            cache[key] = (write_moe_gguf(folder / f"m{len(cache)}.gguf", model, family, qtype=qtype), model)
        return cache[key]

    return make


def _experts_io(model: Any, seed: int = 0) -> tuple[FusedMoE, torch.Tensor, torch.Tensor]:
    experts = model.model.layers[0].mlp.experts
    assert isinstance(experts, FusedMoE)
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(7, experts.hidden_size, generator=generator)
    logits = torch.randn(7, experts.num_experts, generator=generator)
    return experts, hidden, logits


@pytest.mark.parametrize(("family", "overrides"), [("qwen2_moe", QWEN2), ("qwen3_moe", QWEN3)])
def test_f32_file_gives_the_source_checkpoints_logits(moe_gguf, family, overrides):
    path, model = moe_gguf(family, **overrides)
    ids = torch.arange(18).view(2, 9)
    with torch.no_grad():
        got = loader.load_model(str(path), dtype="float32")(ids)
    assert relative_error(got, reference_logits(model, ids)) <= 1e-5


@pytest.mark.parametrize(("qtype", "kernel", "overrides"), [
    (Q.Q4_0, "int4", QWEN3), (Q.Q4_1, "int4", QWEN3), (Q.Q4_K, "int4", K_QUANT), (Q.Q8_0, "int4x2", QWEN3),
], ids=lambda v: v.name if isinstance(v, Q) else None)
def test_quantized_experts_stay_packed_and_compute_the_dequantized_experts(moe_gguf, qtype, kernel, overrides):
    path, _ = moe_gguf("qwen3_moe", qtype, **overrides)
    packed, report = loader.load_model_with_report(str(path), format_options={"packed_cache": False})
    dequantized = loader.load_model(str(path), dtype="float32")
    for part in ("w13", "w2"):
        record = report.quantization["layers"][f"model.layers.0.mlp.experts.{part}"]
        assert (record["kernel"], record["reason"], record["types"][0]) == (kernel, None, qtype.name)
    experts, hidden, logits = _experts_io(packed)
    assert not any(name.startswith(("w13_weight", "w2_weight")) for name, _ in experts.named_parameters())
    reference, _, _ = _experts_io(dequantized)
    with torch.no_grad():
        assert relative_error(experts(hidden, logits), reference(hidden, logits)) <= PACKED_TOLERANCE


def test_each_expert_call_runs_the_path_its_part_s_timings_choose_for_the_rows_routed(moe_gguf, tmp_path,
                                                                                       monkeypatch):
    """A packed part is planned like a linear layer: with timings in which the dequantized twin wins at large
    inputs, an expert reached by many rows dequantizes and one reached by a few runs the kernel; the record has
    the part's path per bucket."""
    from loader.kernels import TOKEN_BUCKETS, kernel_timing, weight_paths

    monkeypatch.setenv("LOADER_KERNEL_MEASURE", "1")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(kernel_timing, "_memory", {})
    fixed_cost = {b: {"packed-bf16": 1e-4 * b, "dequantize": 5e-3, "dense": 1e-5 * b} for b in TOKEN_BUCKETS}
    monkeypatch.setattr(kernel_timing, "measure_paths", lambda *args, **kwargs: fixed_cost)
    path, _ = moe_gguf("qwen3_moe", Q.Q4_0, **QWEN3)
    packed, report = loader.load_model_with_report(str(path), format_options={"packed_cache": False})
    record = report.quantization["layers"]["model.layers.0.mlp.experts.w13"]
    assert record["paths_from"] == "measured" and record["by_tokens"]["float32"]["1"] == "packed-bf16"
    assert record["by_tokens"]["float32"]["65-256"] == "dequantize"
    experts, _, _ = _experts_io(packed)
    ran: list[str] = []
    real_run_path = weight_paths.run_path
    monkeypatch.setattr(weight_paths, "run_path", lambda w, p, x, d=None: ran.append(p) or real_run_path(w, p, x, d))
    hidden = torch.randn(200, experts.hidden_size, generator=torch.Generator().manual_seed(0))
    logits = torch.full((200, experts.num_experts), -10.0)
    logits[:, 0] = 10.0  # every row to expert 0 (and its top-k partners)
    logits[0, 1] = 20.0  # one row to expert 1 first
    with torch.no_grad():
        experts(hidden, logits)
    assert "dequantize" in ran and "packed-bf16" in ran


def test_experts_of_a_type_without_a_kernel_are_dequantized_with_the_reason(moe_gguf):
    path, _ = moe_gguf("qwen3_moe", Q.Q5_0, **QWEN3)
    _, report = loader.load_model_with_report(str(path), format_options={"packed_cache": False})
    record = report.quantization["layers"]["model.layers.0.mlp.experts.w13"]
    assert record["kernel"] == "dequantized" and "Q5_0 has no packed int4 kernel" in record["reason"]


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
@pytest.mark.parametrize("load", [{"dtype": "float32"}, {"format_options": {"packed_cache": False}}],
                         ids=["dequantized", "packed"])
def test_two_simulated_ranks_build_their_share_and_add_up_to_one(moe_gguf, expert_parallel, load):
    path, _ = moe_gguf("qwen3_moe", Q.Q4_0, **QWEN3)
    whole, whole_report = loader.load_model_with_report(str(path), **load)
    experts, hidden, logits = _experts_io(whole)
    with torch.no_grad():
        expected = experts(hidden, logits)
    outputs, shares = [], []
    for rank in range(2):
        with simulated_tp(rank, 2):
            model, report = loader.load_model_with_report(str(path), enable_expert_parallel=expert_parallel, **load)
        mine, _, _ = _experts_io(model)
        shares.append((mine.placement.first_expert, mine.num_local_experts, mine.intermediate_size_per_partition))
        assert report.bytes_read < whole_report.bytes_read
        with torch.no_grad():
            outputs.append(mine(hidden, logits))  # a single process: no all-reduce, this rank's partial sum
    assert shares == ([(0, 2, 64), (2, 2, 64)] if expert_parallel else [(0, 4, 32), (0, 4, 32)])
    tolerance = 1e-5 if "dtype" in load else PACKED_TOLERANCE
    assert relative_error(outputs[0] + outputs[1], expected) <= tolerance


@pytest.mark.needs_plugins  # MixtralForCausalLM is the mistral plugin's
def test_mixtral_file_is_llama_with_experts(moe_gguf):
    path, model = moe_gguf("mixtral")
    ids = torch.arange(18).view(2, 9)
    loaded = loader.load_model(str(path), dtype="float32")
    assert type(loaded).__name__ == "MixtralForCausalLM"
    with torch.no_grad():
        assert relative_error(loaded(ids), reference_logits(model, ids)) <= 1e-5


def test_expert_count_disagreeing_with_the_tensors_is_named(tmp_path):
    model = build_model("qwen3_moe", tiny_config("qwen3_moe", vocab_size=VOCAB))
    path = write_moe_gguf(tmp_path / "m.gguf", model, "qwen3_moe", expert_count=8)
    with pytest.raises(ConfigError, match=r"metadata key 'qwen3moe\.expert_count' is 8 but tensor "
                                          r"'blk\.0\.ffn_\w+_exps\.weight' holds 4 experts"):
        loader.load_model(str(path), dtype="float32")


def test_an_expert_tensor_of_the_wrong_shape_is_named(tmp_path):
    model = build_model("qwen3_moe", tiny_config("qwen3_moe", vocab_size=VOCAB))
    path = write_moe_gguf(tmp_path / "m.gguf", model, "qwen3_moe", shapes={"blk.1.ffn_up_exps.weight": (4, 31, 64)})
    with pytest.raises(ShapeMismatchError, match=r"tensor 'blk\.1\.ffn_up_exps\.weight' "
                                                 r"\(model\.layers\.1\.mlp\.experts\.0\.up_proj\.weight\)"):
        loader.load_model(str(path), dtype="float32")
