"""GPTQ, AWQ and compressed-tensors under ``torchrun`` with two gloo ranks: the dequantized reference's logits.

One launch loads every case (each launch costs seconds). Row-parallel layers
split packed input rows, ``g_idx`` and (without act-order) the groups; with
act-order each rank keeps every group and gathers its activations into its
own sorted order. Experts split their intermediate dimension the same way,
or (``-ep`` cases, ``enable_expert_parallel``) go whole to one rank each.
"""

from __future__ import annotations

import pytest

from tests.helpers.awq_checkpoints import save_awq_checkpoint
from tests.helpers.compressed_tensors_checkpoints import save_ct_checkpoint
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids
from tests.helpers.moe_packed_checkpoints import save_ct_moe_checkpoint, save_gptq_moe_checkpoint
from tests.helpers.torchrun_cases import run_quantized_cases

pytestmark = pytest.mark.torchrun

RANKS = 2
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
MOE_SIZES = dict(moe_intermediate_size=128)
CASES = {
    "llama-sym-g32": ("llama", dict(bits=4, group_size=32, sym=True, desc_act=False), None, "int4pack"),
    # a rank's act-order rows of a row-parallel layer rarely fill whole kernel groups: they are padded
    "llama-asym-actorder-g64": ("llama", dict(bits=4, group_size=64, sym=False, desc_act=True,
                                              checkpoint_format="gptq_v2"), None, "int4pack"),
    "qwen2-actorder-dequantize": ("qwen2", dict(bits=4, group_size=32, sym=False, desc_act=True),
                                  {"kernel": "dequantize"}, "dequantize"),
    "qwen2-8bit-channelwise": ("qwen2", dict(bits=8, group_size=-1, sym=True, desc_act=False), None, "int8pack"),
    "awq-llama-g32": ("llama", dict(group_size=32), None, "int4pack"),
    "ct-qwen2-asym-g32": ("qwen2", dict(bits=4, group_size=32, sym=False), None, "int4pack"),
    # the quantized head splits by vocabulary rows (qzeros in whole packed words), like vLLM's ParallelLMHead
    "llama-lm-head-asym": ("llama", dict(bits=4, group_size=32, sym=False, desc_act=False, lm_head=True,
                                         tie_word_embeddings=False), None, "int4pack"),
    # experts: each rank a slice of every expert (down's act-order rows padded), or whole experts (-ep)
    "moegptq-qwen3-asym-actorder": ("qwen3_moe", dict(group_size=32, sym=False, desc_act=True, **MOE_SIZES), None,
                                    "int4pack"),
    "moegptq-qwen3-asym-actorder-ep": ("qwen3_moe", dict(group_size=32, sym=False, desc_act=True, **MOE_SIZES),
                                       None, "int4pack"),
    "moect-mixtral-asym": ("mixtral", dict(group_size=32, sym=False, intermediate_size=128), None, "int4pack"),
    "moect-qwen2-w8a16-ep": ("qwen2_moe", dict(bits=8, group_size=-1, **MOE_SIZES, intermediate_size=128,
                                               shared_expert_intermediate_size=128), None, "int8pack"),
}
WRITERS = {"awq": save_awq_checkpoint, "ct": save_ct_checkpoint, "moegptq": save_gptq_moe_checkpoint,
           "moect": save_ct_moe_checkpoint}


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptq-tp")
    references, cases = {}, {}
    for name, (family, fields, options, _) in CASES.items():
        write = WRITERS.get(name.partition("-")[0], save_gptq_checkpoint)
        path, references[name] = write(family, root / name, **{**ALIGNED, **fields})
        cases[name] = {"path": str(path), "options": options, "enable_expert_parallel": name.endswith("-ep")}
    out, ranks = run_quantized_cases(cases, root, ranks=RANKS)
    return references, out, ranks


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_give_the_dequantized_reference_logits(tp_run, name):
    import torch

    references, out, ranks = tp_run
    reference = references[name]
    expected = reference_logits(reference, random_ids(reference.config.vocab_size))
    for rank, results in enumerate(ranks):
        assert "error" not in results[name], results[name]
        assert results[name]["tp_size"] == RANKS
        assert set(results[name]["kernels"]) == set(CASES[name][3].split("+"))
        error = relative_error(torch.load(out / f"{name}-rank{rank}.pt"), expected)
        print(f"{name} rank {rank}: relative error {error:.3g} against the dequantized reference")
        assert error <= 1e-3, f"{name} rank {rank}: relative error {error:.3g}"
