"""Tensor parallelism over two gloo processes: same logits as one process, half the bytes read.

One ``torchrun`` launch loads every checkpoint of the module (each launch costs
seconds), then each test reads its part of the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.hf_checkpoints import build_model, relative_error, tiny_config
from tests.helpers.mistral_native import save_native_checkpoint
from tests.helpers.model_checks import load, random_ids, write_family_checkpoint

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "tp_logits.py"
RANKS = 2
CASES = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {}),
    "one-kv-head": ("llama", {"num_key_value_heads": 1}),
    "mistral-native": ("mistral", {"sliding_window": 4}),
    "three-heads": ("llama", {"hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1}),
    # mixture-of-experts: experts sliced on every rank, or (::ep) whole experts per rank; 3 experts split 2 + 1
    "mixtral": ("mixtral", {}),
    "mixtral::ep": ("mixtral", {}),
    "qwen2-moe::ep": ("qwen2_moe", {}),
    "qwen3-moe": ("qwen3_moe", {}),
    "qwen3-moe-3-experts::ep": ("qwen3_moe", {"num_local_experts": 3}),
}


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    paths = {}
    for case, (family, overrides) in CASES.items():
        folder, _, mode = case.partition("::")  # "::ep": a checkpoint loaded with expert parallelism
        target = root / folder
        paths[case] = Path(f"{target}::{mode}") if mode else target
        if target.exists():
            continue  # the same checkpoint as its tensor-parallel case
        if case == "mistral-native":  # params.json + consolidated.safetensors, q/k rows interleaved
            save_native_checkpoint(build_model(family, tiny_config(family, **overrides)), target)
        else:
            write_family_checkpoint(family, target, **overrides)
    out = root / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
               str(SCRIPT), str(out), *(str(p) for p in paths.values())]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    return paths, ranks


def _single_process_logits(path: Path) -> torch.Tensor:
    model = load(Path(str(path).partition("::")[0]))
    with torch.no_grad():
        return model(random_ids(model.config.vocab_size))


@pytest.mark.parametrize("case", ["llama", "qwen2", "one-kv-head", "mistral-native", "mixtral", "mixtral::ep",
                                  "qwen2-moe::ep", "qwen3-moe", "qwen3-moe-3-experts::ep"])
def test_every_rank_gives_the_single_process_logits(tp_run, case):
    paths, ranks = tp_run
    expected = _single_process_logits(paths[case])
    for rank, results in enumerate(ranks):
        result = results[str(paths[case])]
        assert "error" not in result, result
        assert result["tp_size"] == RANKS
        actual = torch.load(result["logits"])
        assert actual.shape == expected.shape
        error = relative_error(actual, expected)
        assert error <= 1e-5, f"rank {rank}: relative error {error:.3g}"


@pytest.mark.parametrize("case", ["llama", "mistral-native", "mixtral", "mixtral::ep"])
def test_each_rank_reads_about_half_of_the_checkpoint(tp_run, case):
    """The native layout's rotary row permutation must not make a rank read other ranks' heads."""
    paths, ranks = tp_run
    for rank, results in enumerate(ranks):
        result = results[str(paths[case])]
        assert result["checkpoint_bytes"] > 0
        share = result["bytes_read"] / result["checkpoint_bytes"]
        assert 0.4 < share <= 0.55, f"rank {rank} read {share:.1%} of the checkpoint"


def test_heads_that_tp_does_not_divide_are_refused_on_every_rank(tp_run):
    paths, ranks = tp_run
    for results in ranks:
        error = results[str(paths["three-heads"])]["error"]
        assert error.startswith("UnsupportedError: ")
        assert "num_attention_heads=3 is not divisible by tensor parallel size 2" in error
