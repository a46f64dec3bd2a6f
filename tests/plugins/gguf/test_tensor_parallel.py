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
    "qwen2-q8_0": ("qwen2", Q.Q8_0, {}),
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
def test_two_ranks_packed_give_the_single_process_packed_logits(tp_run, case):
    """The default (packed, bfloat16 kernel) load at tp=2 against tp=1, within 1e-5 on every path.

    A packed row-parallel layer (o_proj, down_proj) reduces the same two input-column halves at tp=1 as the
    two ranks do, each rounded to bfloat16 by its kernel call and added in float32 (``REDUCTION_SLICES``);
    before that, tp=1 rounded one sum and the Q4_0 model differed by 2.4e-3 (Q4_K 1.2e-3). A tied Q8_0
    head refines the top 64 logits of each half of the vocabulary at tp=1, as each rank does of its own
    rows (before: the top 64 of all rows, 1.0e-3 apart). Measured: Q4_0 and Q4_K bit-equal; Q8_0 1.6e-7
    (its linears are dequantized float32, summed in another order).
    """
    files, ranks = tp_run
    path = files[case]
    ids = torch.arange(24).view(2, 12) % 200
    packed = loader.load_model(str(path))
    with torch.no_grad():
        expected = packed(ids)
    got = [torch.load(rank[str(path)]["packed_logits"]) for rank in ranks]
    assert torch.equal(got[0], got[1])
    assert relative_error(got[0], expected) <= 1e-5, relative_error(got[0], expected)


def test_packed_row_parallel_layers_reduce_in_the_halves_two_ranks_would(tiny_gguf):
    """At tp=1 o_proj/down_proj hold two input-column slices (float32 sum); column-parallel layers one."""
    path, _ = tiny_gguf("llama", Q.Q4_0, rope_scaling=None)
    model = loader.load_model(str(path))
    modules = dict(model.named_modules())
    for name, slices in (("model.layers.0.self_attn.o_proj", 2), ("model.layers.0.mlp.down_proj", 2),
                         ("model.layers.0.self_attn.qkv_proj", 1), ("model.layers.0.mlp.gate_up_proj", 1)):
        layer = modules[name]
        weight = layer.quant_method.int4_weight(layer)
        assert weight is not None and weight.slices == slices, name
    for options in ({"format_options": {"kernel_dtype": "float32"}}, {"dtype": "bfloat16"}):
        other = loader.load_model(str(path), **options)
        down = dict(other.named_modules())["model.layers.0.mlp.down_proj"]
        # a float32 kernel rounds nothing to slice for; bfloat16 activations round the sum again anyway
        assert down.quant_method.int4_weight(down).slices == 1, options


@pytest.mark.parametrize("case", list(CASES))
def test_two_ranks_packed_with_the_float32_kernel_match_tp1_within_1e_5(tp_run, case):
    """``format_options={"kernel_dtype": "float32"}``: float32 partial sums, so tp=2 adds up as tp=1 does."""
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


def test_a_tied_q8_0_head_refines_the_rows_each_of_two_ranks_would_hold(tiny_gguf):
    """At tp=1 the vocabulary's two tp=2 halves (padded as tp=2 pads), at tp=2 the rank's own real rows."""
    from loader.testing import simulated_tp
    from loader_plugin_gguf.embedding import _refine_spans

    path, model = tiny_gguf("qwen2", Q.Q8_0)
    vocab = model.config.vocab_size
    whole = loader.load_model(str(path))
    embedding = whole.model.embed_tokens
    half = -(-vocab // 128) * 128 // 2  # tp=2 pads to a multiple of 2 x 64 rows and gives each rank half
    assert _refine_spans(embedding) == [(0, half), (half, vocab)]
    for rank in (0, 1):
        with simulated_tp(rank, 2):
            shard = loader.load_model(str(path))
        assert _refine_spans(shard.model.embed_tokens) == [(0, shard.model.embed_tokens.real_rows)]
