"""Tensor parallelism from the config's ``base_model_tp_plan``: tp=2 under torchrun gives the tp=1 logits.

Granite's plan is plain colwise/rowwise; OLMo 2's gathers q/k/v (their norms
need whole rows) and splits o_proj's input; Phi-3's fuses qkv and gate/up; a
Granite with one KV head on two ranks replicates it (as vLLM does); Mixtral's and
Qwen2-MoE's fused experts split their intermediate rows (``packed_colwise`` /
``rowwise``). Every load is forced through the fallback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loader
from tests.helpers.hf_checkpoints import relative_error
from tests.helpers.hf_fallback_checkpoints import save_fallback_checkpoint
from tests.plugins.transformers.scripts.tp_fallback import IDS
from tests.plugins.transformers.test_moe_conversions import MOE_FAMILIES

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).parent / "scripts" / "tp_fallback.py"
RANKS = 2
CASES = {"granite": ("granite", {"tie_word_embeddings": False}), "olmo2": ("olmo2", {}), "phi3": ("phi3", {}),
         "granite-one-kv-head": ("granite", {"num_key_value_heads": 1}),  # tp=2 > 1 KV head: replicated
         "mixtral": ("mixtral", MOE_FAMILIES["mixtral"]), "qwen2_moe": ("qwen2_moe", MOE_FAMILIES["qwen2_moe"])}


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp-fallback")
    paths = {case: root / case for case in CASES}
    for case, (family, overrides) in CASES.items():
        save_fallback_checkpoint(paths[case], family, **overrides)
    out = root / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
               str(SCRIPT), str(out), *(str(p) for p in paths.values())]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    return paths, ranks


@pytest.mark.parametrize("case", sorted(CASES))
def test_tp2_logits_equal_tp1(tp_run, case):
    paths, ranks = tp_run
    model = loader.load_model(str(paths[case]), dtype="float32", model_impl="transformers")
    with torch.no_grad():
        expected = model(IDS)
    for rank, results in enumerate(ranks):
        result = results[str(paths[case])]
        assert "error" not in result, result
        assert result["tp_size"] == RANKS
        error = relative_error(torch.load(result["logits"]), expected)
        assert error <= 1e-5, f"rank {rank}: relative error {error:.3g}"


@pytest.mark.parametrize("case", ["granite", "mixtral"])
def test_each_rank_reads_only_its_share_of_the_planned_layers(tp_run, case):
    paths, ranks = tp_run
    for results in ranks:
        result = results[str(paths[case])]
        # embeddings and the head are replicated; every planned linear (and expert) is read half
        assert result["bytes_read"] < 0.75 * result["checkpoint_bytes"], result
