"""int8 compressed-tensors groups under ``torchrun`` with two gloo ranks: each rank's logits equal the reference.

Column-parallel layers split the codes and per-row scales by output rows (a per-tensor scale goes whole to every
rank, one per fused part); row-parallel layers split the codes and group scales by input columns. One launch
loads every case. ``int8_mm`` cases compare with the reference whose linears' inputs are fake-quantized.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.int8_checkpoints import fake_quantize_inputs, int8_scheme, save_int8_checkpoint
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_cases import run_quantized_cases

pytestmark = pytest.mark.torchrun

SCRIPT = Path(__file__).parents[2] / "helpers" / "scripts" / "tp_int8_worker.py"
RANKS = 2
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "llama-channel-token": ("llama", int8_scheme("channel"), None, "dequantized"),
    "qwen2-tensor-asym-static-asym": ("qwen2", int8_scheme("tensor", symmetric=False, activations="tensor",
                                                           activation_symmetric=False), None, "dequantized"),
    "llama-group32-weight-only": ("llama", int8_scheme("group", activations=None), None, "dequantized"),
    # dynamic per-token scales: a row-parallel rank gathers each row's extremes over the ranks (both kernels), so
    # every rank rounds with the whole row's scale; compared within 1e-2 only because tp=2's all-reduced sums
    # differ from tp=1's in the last bits and a rounding to the int8 grid can flip a code
    "qwen2-channel-token-int8-mm": ("qwen2", int8_scheme("channel"), {"kernel": "int8_mm"}, "int8_mm"),
    "llama-tensor-static-int8-mm": ("llama", int8_scheme("tensor", activations="tensor"), {"kernel": "int8_mm"},
                                    "int8_mm"),
}


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("int8-tp")
    references, cases = {}, {}
    for name, (family, scheme, options, _) in CASES.items():
        path, reference = save_int8_checkpoint(family, root / name, scheme, **ALIGNED)
        if scheme["input_activations"] is not None:
            reference = fake_quantize_inputs(reference, scheme["input_activations"])
        references[name] = reference
        cases[name] = {"path": str(path), "options": options}
    out, ranks = run_quantized_cases(cases, root, ranks=RANKS, script=SCRIPT)
    return references, out, ranks


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_rank_s_logits_match_the_reference_at_tp2(tp_run, case):
    references, out, ranks = tp_run
    kernel = CASES[case][3]
    reference = references[case]
    expected = reference_logits(reference, random_ids(reference.config.vocab_size))
    for rank in range(RANKS):
        assert ranks[rank][case].get("tp_size") == RANKS, ranks[rank][case]
        assert set(ranks[rank][case]["kernels"]) == {kernel}
        logits = torch.load(out / f"{case}-rank{rank}.pt")
        tolerance = {"qwen2-channel-token-int8-mm": 1e-2, "llama-channel-token": 1e-2}.get(case, 1e-3)
        assert relative_error(logits, expected) <= tolerance
