"""Weights from a trainer process: one ``torchrun`` world of three, rank 0 a trainer, ranks 1-2 a TP=2 model.

The inference ranks load checkpoint A over their own TP group (``loader.set_tensor_parallel_group``); the
trainer holds B as a ``transformers`` model and broadcasts it (``loader.send_weights``) in buckets smaller than
most tensors; each inference rank keeps its shard (``loader.update_weights_from_distributed``). One launch runs
every case (each launch costs seconds); each test reads its part of the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers.hf_checkpoints import relative_error, save_checkpoint

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "trainer_update.py"
WORLD = 3
INFERENCE = (1, 2)
DISAGREE = ("ConfigError: the specs disagree with what rank 0 sends: 'model.norm.weight' arrives as float32 (32,) "
            "where the specs say float32 (64,); 'extra.weight' (float32 (2,)) arrives but is not in the specs")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, dict]]:
    root = tmp_path_factory.mktemp("trainer")
    for family in ("llama", "qwen2"):
        save_checkpoint(family, root / family / "A", seed=0)
    out = root / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={WORLD}",
               str(SCRIPT), str(out), str(root)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(WORLD)]


@pytest.mark.parametrize(("case", "version"), [("llama", 1), ("after-errors", 2), ("qwen2-unknown-lenient", 1)])
def test_the_tp_group_gets_the_trainer_models_logits(ranks, case, version) -> None:
    reference_case = "llama" if case == "after-errors" else case  # the failed transfers between wrote nothing
    expected = torch.load(ranks[0][reference_case]["logits"])
    for rank in INFERENCE:
        result = ranks[rank][case]
        assert "error" not in result, result
        assert result["tp_size"] == 2 and result["storage_kept"] and result["version"] == version
        error = relative_error(torch.load(result["logits"]), expected)
        assert error <= 1e-5, f"rank {rank}: relative error {error:.3g}"


def test_the_trainer_sends_in_buckets_and_each_rank_writes_every_tensor(ranks) -> None:
    sent = ranks[0]["llama"]["sent"]
    for rank in INFERENCE:
        result = ranks[rank]["llama"]
        assert result["tensors"] == 21  # every tensor of the tiny Llama's state_dict (lm_head included)
        assert result["bytes"] == 427_264  # their bytes; the buckets also carry the alignment padding
    assert sent >= 427_264


def test_a_name_set_aside_with_strict_false(ranks) -> None:
    for rank in INFERENCE:
        assert ranks[rank]["qwen2-unknown-lenient"]["skipped"] == ["model.layers.0.self_attn.rotary.weight"]


def test_the_trainer_cannot_join_the_inference_tp_group(ranks) -> None:
    assert ranks[0]["trainer-joins-tp-group"]["error"] == (
        "ConfigError: this process (rank 0) is not in the group given to set_tensor_parallel_group; only the "
        "group's members call it")


def test_specs_that_disagree_with_what_arrives(ranks) -> None:
    for rank in INFERENCE:
        assert ranks[rank]["specs-disagree"]["error"] == DISAGREE
    trainer = ranks[0]["specs-disagree"]["error"]
    assert trainer.startswith("LoadError: the weight transfer stopped before any tensor was sent: rank 1: ")
    assert f"rank 2: {DISAGREE}" in trainer


def test_a_name_the_model_lacks_is_refused_before_anything_is_sent(ranks) -> None:
    for rank in INFERENCE:
        error = ranks[rank]["unknown-name"]["error"]
        assert error.startswith("UnexpectedWeightError: ")
        assert "'model.layers.0.self_attn.rotary.weight'" in error
        assert error.endswith("nothing was written (the update was checked whole first)")
    assert "rank 1: UnexpectedWeightError: " in ranks[0]["unknown-name"]["error"]


def test_a_bucket_size_below_one_stops_every_rank(ranks) -> None:
    message = "UnsupportedError: bucket_bytes must be a whole number of bytes, at least 1; found 0"
    assert ranks[0]["bucket-zero"]["error"] == message
    assert ranks[1]["bucket-zero"]["error"] == message
    assert ranks[2]["bucket-zero"]["error"] == (
        f"LoadError: the weight transfer from rank 0 stopped before any tensor was sent: rank 0: {message}; "
        f"rank 1: {message}")


def test_buckets_of_another_size_than_the_senders(ranks) -> None:
    for rank in INFERENCE:
        assert ranks[rank]["bucket-mismatch"]["error"] == (
            "ConfigError: rank 0 sends buckets of 4096 bytes but this rank was given bucket_bytes=536870912; give "
            "the sender and the receivers the same bucket size")
