"""bitsandbytes under ``torchrun`` with two gloo ranks: the same logits as one process.

One launch loads every case (each launch costs seconds): a pre-quantized
checkpoint written by ``transformers`` and in-flight quantization of a dense one.
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
from tests.helpers.bnb_checkpoints import save_bnb_checkpoint
from tests.helpers.hf_checkpoints import relative_error
from tests.helpers.model_checks import random_ids

pytestmark = pytest.mark.torchrun

REPO = Path(__file__).resolve().parents[3]
SCRIPT = Path(__file__).parents[2] / "helpers" / "scripts" / "tp_quantized_worker.py"
RANKS = 2
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bnb-tp")
    prequantized = save_bnb_checkpoint("llama", root / "llama", quant_type="nf4", double_quant=True, **ALIGNED)
    dense = prequantized.parent / "dense"
    cases = {
        "prequantized": {"path": str(prequantized), "quantization": None, "options": None},
        "in-flight-nf4": {"path": str(dense), "quantization": "bitsandbytes", "options": {"quant_type": "nf4"}},
        "in-flight-fp4-double": {"path": str(dense), "quantization": "bitsandbytes",
                                 "options": {"quant_type": "fp4", "double_quant": True}},
    }
    cases_file = root / "cases.json"
    cases_file.write_text(json.dumps(cases))
    out = root / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}",
               str(SCRIPT), str(out), str(cases_file)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(RANKS)]
    return cases, out, ranks


def _single_process_logits(case, monkeypatch):
    model = loader.load_model(case["path"], dtype="float32", quantization=case["quantization"],
                              quantization_options=case["options"])
    with torch.no_grad():
        return model(random_ids(model.config.vocab_size))


# Pre-quantized weights are identical on every layout; in-flight slices of whole blocks quantize to the
# same codes as the whole weight, and double quantization nests each whole checkpoint module's absmax.
@pytest.mark.parametrize(("name", "tolerance"), [("prequantized", 1e-5), ("in-flight-nf4", 1e-5),
                                                 ("in-flight-fp4-double", 1e-5)])
def test_two_ranks_give_the_single_process_logits(tp_run, monkeypatch, name, tolerance):
    cases, out, ranks = tp_run
    expected = _single_process_logits(cases[name], monkeypatch)
    for rank, results in enumerate(ranks):
        assert "error" not in results[name], results[name]
        assert results[name]["tp_size"] == RANKS
        actual = torch.load(out / f"{name}-rank{rank}.pt")
        error = relative_error(actual, expected)
        print(f"{name} rank {rank}: relative error {error:.3g} against tp=1")
        assert error <= tolerance, f"{name} rank {rank}: relative error {error:.3g}"
