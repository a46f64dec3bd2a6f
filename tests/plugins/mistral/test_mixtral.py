"""Mixtral checkpoints written by transformers load natively (``block_sparse_moe``, ``w1``/``w2``/``w3``)."""

from __future__ import annotations

import pytest
import torch

import loader
from loader._distributed import simulated_tp
from loader.layers import SparseMoeBlock
from tests.helpers.model_checks import (
    assert_cache_matches_full,
    assert_logits_match,
    load,
    write_family_checkpoint,
)


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixtral")
    return path, write_family_checkpoint("mixtral", path)


def test_mixtral_matches_transformers(mixtral):
    path, reference = mixtral
    model = load(path)
    block = model.model.layers[0].mlp
    assert isinstance(block, SparseMoeBlock) and block.experts.routing.renormalize
    expected = reference.state_dict()["model.layers.0.mlp.experts.gate_up_proj"]
    assert torch.equal(block.experts.w13_weight, expected)
    assert_logits_match(model, reference)
    assert_cache_matches_full(model, reference.config.vocab_size)


def test_mixtral_bfloat16(mixtral):
    path, reference = mixtral
    assert_logits_match(load(path, "bfloat16"), reference, dtype=torch.bfloat16)


def test_expert_parallel_does_not_need_an_intermediate_size_the_ranks_divide(tmp_path):
    """Whole experts per rank: ``intermediate_size`` (the experts') is never split, so 3 ranks may hold 4 experts
    of 30 rows (2, 1, 1) as long as the heads split."""
    write_family_checkpoint("mixtral", tmp_path, intermediate_size=30, num_attention_heads=6, num_key_value_heads=3,
                            hidden_size=48)
    held = []
    for rank in range(3):
        with simulated_tp(rank, 3):
            model = loader.load_model(str(tmp_path), dtype="float32", enable_expert_parallel=True)
        held.append(list(model.model.layers[1].mlp.experts.placement.local_experts))
    assert held == [[0, 1], [2], [3]]
