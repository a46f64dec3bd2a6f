"""GGUF under tensor parallelism (two gloo ranks): single-process logits, each rank reading about half.

Row splits (q/k/v, gate/up, vocab) narrow quantized rows before dequantizing; column splits
(o_proj, down_proj) narrow whole blocks, or the enclosing blocks when a shard edge falls
inside a K-quant super-block (o_proj of a 256-wide K-quant model split in two).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from tests.helpers.gguf_files import Q
from tests.helpers.hf_checkpoints import relative_error

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).parent / "scripts" / "tp_gguf.py"
CASES: dict[str, tuple[str, Q, dict[str, Any]]] = {
    "llama-q4_0": ("llama", Q.Q4_0, {"rope_scaling": None}),
    "llama-q4_k": ("llama", Q.Q4_K, {"rope_scaling": None, "hidden_size": 256, "intermediate_size": 512}),
    "llama-q8_0": ("llama", Q.Q8_0, {"rope_scaling": None}),  # linears and the untied head as int4x2
    "qwen2-q8_0": ("qwen2", Q.Q8_0, {}),  # the tied head as two int4 planes (int4x2)
    # fused layers whose parts need different kernels: q/k int4 beside a dense F16 v, gate int4 beside up int4x2
    "llama-mixed": ("llama", Q.Q4_0, {"rope_scaling": None, "quantized_as": {"blk.0.attn_v.weight": Q.F16,
                                                                             "blk.1.ffn_up.weight": Q.Q8_0}}),
    # Q6_K: linears dequantized to bfloat16 (dtype auto), the tied head as int8 codes per 16-value group
    "qwen2-q6_k": ("qwen2", Q.Q6_K, {"hidden_size": 256, "intermediate_size": 512}),
}


@pytest.fixture(scope="module")
def tp_run(tiny_gguf, tmp_path_factory):
    files = {case: tiny_gguf(family, qtype, **overrides)[0] for case, (family, qtype, overrides) in CASES.items()}
    out = tmp_path_factory.mktemp("tp-out")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(SCRIPT), str(out), *(str(p) for p in files.values())]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return files, [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_give_single_process_logits_reading_about_half(tp_run, case):
    files, ranks = tp_run
    path = files[case]
    ids = torch.arange(24).view(2, 12) % 200
    with torch.no_grad():
        expected = loader.load_model(str(path), dtype="float32")(ids)
    single = loader.load_model_with_report(str(path), dtype="float32")[1].bytes_read
    for rank in ranks:
        result = rank[str(path)]
        assert result["tp_size"] == 2
        assert relative_error(torch.load(result["logits"]), expected) <= 1e-5
        assert result["bytes_read"] < 0.75 * single


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_packed_match_the_single_process_packed_logits_within_1e_5(tp_run, case):
    """The default (packed, bfloat16 kernel) load at tp=2 against tp=1, every layer kept as at tp=1.

    A packed row-parallel layer (o_proj, down_proj) computes whole output rows over the gathered input on each
    rank, so no rank adds bfloat16 partial sums that tp=1 rounds once (summing the two ranks' halves of the
    columns instead was 2.4e-3 off for Q4_0, 1.2e-3 for Q4_K); a tied Q8_0 head refines the whole vocabulary's
    top 64 logits, as tp=1 does, not each rank's own top 64 (1.0e-3 off).
    """
    files, ranks = tp_run
    path = files[case]
    ids = torch.arange(24).view(2, 12) % 200
    packed, report = loader.load_model_with_report(str(path))
    with torch.no_grad():
        expected = packed(ids)
    got = [torch.load(rank[str(path)]["packed_logits"]) for rank in ranks]
    assert torch.equal(got[0], got[1])
    assert relative_error(got[0], expected) <= 1e-5
    single_kernels = {name: layer["kernel"] for name, layer in report.quantization["layers"].items()}
    assert {"int4", "int8", "int4x2"} & set(single_kernels.values())
    for rank in ranks:
        assert rank[str(path)]["packed_logits_layers"] == single_kernels


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_packed_with_the_float32_kernel_match_tp1_within_1e_5(tp_run, case):
    """``format_options={"kernel_dtype": "float32"}``: tp=2 computes tp=1's outputs with the float32 kernel too."""
    files, ranks = tp_run
    path = files[case]
    ids = torch.arange(24).view(2, 12) % 200
    packed, report = loader.load_model_with_report(str(path), format_options={"kernel_dtype": "float32"})
    assert report.quantization["kernel_dtype"] == "float32"
    with torch.no_grad():
        expected = packed(ids)
    got = [torch.load(rank[str(path)]["exact_packed_logits"]) for rank in ranks]
    assert torch.equal(got[0], got[1])
    assert relative_error(got[0], expected) <= 1e-5


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_maps_its_own_packed_bundle_and_computes_what_it_packed(tp_run, case):
    """The packed-weights bundle under torchrun: each rank writes and maps a bundle of its own (the variant names
    the rank), every unit found on the second load, the logits bit-equal to the rank's packed load."""
    files, ranks = tp_run
    path = files[case]
    paths = set()
    for rank in ranks:
        result = rank[str(path)]
        cache = result["mapped_cache"]
        assert cache["misses"] == 0 and cache["hits"] > 0 and cache["notes"] == []
        paths.add(cache["path"])
        assert torch.equal(torch.load(result["mapped_logits"]), torch.load(result["packed_logits"]))
    assert len(paths) == 2
