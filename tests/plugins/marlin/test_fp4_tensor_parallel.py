"""FP4 checkpoints under ``torchrun`` with two gloo ranks: each rank's logits equal the one-process reference.

Column-parallel layers split each fused part's rows and their group scales (each
part keeps its own global scale); row-parallel layers split the packed input
columns and the group scales in whole groups (an input rounded to NVFP4 is rounded
per group, so each rank rounds its own columns). A split inside a group is refused.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.fp4_checkpoints import save_fp4_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_cases import run_quantized_cases

pytestmark = pytest.mark.torchrun

RANKS = 2
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "llama-ct-nvfp4": ("llama", "ct-nvfp4", ALIGNED),
    "qwen2-ct-mxfp4": ("qwen2", "ct-mxfp4", ALIGNED),
    "llama-modelopt-nvfp4": ("llama", "modelopt-nvfp4", ALIGNED),
    "qwen2-ct-nvfp4": ("qwen2", "ct-nvfp4", ALIGNED),
    "llama-ct-nvfp4-w4a4": ("llama", "ct-nvfp4-w4a4", ALIGNED),
}
# hidden 96 over two ranks: o_proj's 48 input columns per rank cut an MXFP4 group of 32
CUT = ("llama", "ct-mxfp4", dict(ALIGNED, hidden_size=96))


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp4-tp")
    references, cases = {}, {}
    for name, (family, layout, sizes) in {**CASES, "cut": CUT}.items():
        path, references[name] = save_fp4_checkpoint(family, root / name, layout, **sizes)
        cases[name] = {"path": str(path), "options": None}
    out, ranks = run_quantized_cases(cases, root, ranks=RANKS)
    return references, out, ranks


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_give_the_reference_logits(tp_run, name):
    references, out, ranks = tp_run
    reference = references[name]
    expected = reference_logits(reference, random_ids(reference.config.vocab_size))
    for rank, results in enumerate(ranks):
        assert "error" not in results[name], results[name]
        assert results[name]["tp_size"] == RANKS
        assert results[name]["kernels"] == {"dequantized": 8}
        error = relative_error(torch.load(out / f"{name}-rank{rank}.pt"), expected)
        assert error <= 1e-3, f"{name} rank {rank}: relative error {error:.3g}"


def test_a_split_inside_a_group_is_refused(tp_run):
    _, _, ranks = tp_run
    for results in ranks:
        assert results["cut"]["error"] == (
            "UnsupportedError: model.layers.0.self_attn.o_proj: tensor parallel size 2 gives each rank 48 of 96 "
            "input columns, which cuts a group of 32 (MXFP4 scales one per group); the columns per rank must be a "
            "multiple of 32")
