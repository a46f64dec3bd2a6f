"""FP8 checkpoints under ``torchrun`` with two gloo ranks: each rank's logits equal the one-process reference.

Column-parallel layers split the rows of each part and of its scales (per-row
scales by rows, block grids in whole blocks, per-tensor scales whole); row-parallel
layers split the input, block grids by whole column blocks, and per-token
activation maxima are gathered over the ranks. A split inside a block is refused.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.fp8_checkpoints import save_fp8_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_cases import run_quantized_cases

pytestmark = pytest.mark.torchrun

SCRIPT = Path(__file__).parents[2] / "helpers" / "scripts" / "tp_fp8_worker.py"
RANKS = 2
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "llama-fp8-block": ("llama", "fp8-block", (32, 32), None, "fp8_dequantized"),
    "qwen2-fbgemm": ("qwen2", "fbgemm", (32, 32), None, "fp8_dequantized"),
    "llama-ct-channel-token": ("llama", "ct-channel-token", (32, 32), None, "fp8_dequantized"),
    "qwen2-ct-tensor-static": ("qwen2", "ct-tensor-static", (32, 32), None, "fp8_dequantized"),
    "llama-ct-tensor-dynamic-scaled-mm": ("llama", "ct-tensor-dynamic", (32, 32), {"kernel": "scaled_mm"},
                                          "fp8_scaled_mm"),
    "qwen2-ct-block-group": ("qwen2", "ct-block-group", (32, 32), None, "fp8_dequantized"),
}
# 96-row blocks: each rank's 64 rows of q (32 of k, v) end inside a block
CUT = ("llama", "fp8-block", (96, 32))


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8-tp")
    references, cases = {}, {}
    for name, (family, layout, block, options, _) in {**CASES, "cut": (*CUT, None, "")}.items():
        path, references[name] = save_fp8_checkpoint(family, root / name, layout, block=block, **ALIGNED)
        cases[name] = {"path": str(path), "options": options}
    out, ranks = run_quantized_cases(cases, root, ranks=RANKS, script=SCRIPT)
    return references, out, ranks


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_give_the_reference_logits(tp_run, name):
    references, out, ranks = tp_run
    reference = references[name]
    expected = reference_logits(reference, random_ids(reference.config.vocab_size))
    for rank, results in enumerate(ranks):
        assert "error" not in results[name], results[name]
        assert results[name]["tp_size"] == RANKS
        assert set(results[name]["kernels"]) == {CASES[name][4]}
        error = relative_error(torch.load(out / f"{name}-rank{rank}.pt"), expected)
        assert error <= 1e-3, f"{name} rank {rank}: relative error {error:.3g}"


def test_a_split_inside_a_block_is_refused_on_every_rank(tp_run):
    _, _, ranks = tp_run
    assert ranks[0]["cut"]["error"] == (
        "UnsupportedError: model.layers.0.self_attn.qkv_proj: FP8 weight blocks of 96x32: tensor parallel size 2 "
        "gives this rank rows [0, 64) of part 'q' (128 rows), which cuts a block; each rank's rows must start and "
        "end on a multiple of 96")
    assert ranks[1]["cut"]["error"].startswith("UnsupportedError: model.layers.0.self_attn.qkv_proj: FP8 weight "
                                               "blocks of 96x32: tensor parallel size 2 gives this rank rows [64, 128)")
