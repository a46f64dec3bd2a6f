"""Qwen2-MoE and Qwen3-MoE checkpoints written by transformers load natively and give its logits."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader._distributed import simulated_tp
from loader.errors import MissingWeightsError, ShapeMismatchError, UnexpectedWeightError, UnsupportedError
from loader.layers import FusedMoE, SparseMoeBlock
from loader_plugin_llama import LlamaMLP
from tests.helpers.model_checks import (
    assert_cache_matches_full,
    assert_logits_match,
    load,
    write_family_checkpoint,
)


@pytest.fixture(scope="module")
def qwen2_moe(tmp_path_factory):
    """Shared expert, ``norm_topk_prob`` off, layer 1 dense through ``mlp_only_layers``."""
    path = tmp_path_factory.mktemp("qwen2_moe")
    return path, write_family_checkpoint("qwen2_moe", path)


@pytest.fixture(scope="module")
def qwen3_moe(tmp_path_factory):
    """q/k norms, ``norm_topk_prob`` on, no shared expert."""
    path = tmp_path_factory.mktemp("qwen3_moe")
    return path, write_family_checkpoint("qwen3_moe", path)


def test_qwen2_moe_matches_transformers(qwen2_moe):
    path, reference = qwen2_moe
    model = load(path)
    layers = model.model.layers
    assert [type(layer.mlp) for layer in layers] == [SparseMoeBlock, LlamaMLP, SparseMoeBlock]
    block = layers[0].mlp
    assert block.shared_expert is not None and not block.experts.routing.renormalize
    assert torch.equal(block.experts.w2_weight[3], reference.state_dict()["model.layers.0.mlp.experts.down_proj"][3])
    assert_logits_match(model, reference)
    assert_cache_matches_full(model, reference.config.vocab_size)


def test_qwen2_moe_bfloat16(qwen2_moe):
    path, reference = qwen2_moe
    assert_logits_match(load(path, "bfloat16"), reference, dtype=torch.bfloat16)


def test_qwen3_moe_matches_transformers(qwen3_moe):
    path, reference = qwen3_moe
    model = load(path)
    block = model.model.layers[1].mlp
    assert isinstance(block, SparseMoeBlock) and block.shared_expert is None and block.experts.routing.renormalize
    assert_logits_match(model, reference)
    assert_cache_matches_full(model, reference.config.vocab_size)


def test_decoder_sparse_step_makes_every_other_layer_sparse(tmp_path):
    reference = write_family_checkpoint("qwen3_moe", tmp_path, decoder_sparse_step=2, num_hidden_layers=2)
    model = load(tmp_path)
    assert [type(layer.mlp) for layer in model.model.layers] == [LlamaMLP, SparseMoeBlock]
    assert_logits_match(model, reference)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_two_simulated_ranks_each_build_their_share(qwen3_moe, expert_parallel):
    path, _ = qwen3_moe
    shapes = []
    for rank in range(2):
        with simulated_tp(rank, 2):
            model = loader.load_model(str(path), dtype="float32", enable_expert_parallel=expert_parallel)
        experts = model.model.layers[0].mlp.experts
        assert isinstance(experts, FusedMoE)
        shapes.append((experts.placement.first_expert, tuple(experts.w13_weight.shape)))
    if expert_parallel:
        assert shapes == [(0, (2, 64, 64)), (2, (2, 64, 64))]
    else:
        assert shapes == [(0, (4, 32, 64)), (0, (4, 32, 64))]


def _config(path):
    return json.loads((path / "config.json").read_text())


def _write_config(path, config):
    (path / "config.json").write_text(json.dumps(config))


def _drop_tensor(path, name):
    """Remove ``name`` from the shard holding it and from the index, as a checkpoint that never had it."""
    index_file = path / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    shard = path / index["weight_map"].pop(name)
    tensors = load_file(shard)
    del tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    index_file.write_text(json.dumps(index))


def test_an_expert_missing_from_the_checkpoint_is_named(tmp_path):
    write_family_checkpoint("qwen3_moe", tmp_path)
    _drop_tensor(tmp_path, "model.layers.1.mlp.experts.3.up_proj.weight")
    with pytest.raises(MissingWeightsError, match=r"the experts 'model\.layers\.1\.mlp\.experts' \(num_experts=4\) "
                       r"lack 'model\.layers\.1\.mlp\.experts\.3\.up_proj\.weight' in the checkpoint"):
        load(tmp_path)


def test_num_experts_larger_than_the_checkpoints_is_named(tmp_path):
    """The router's rows come first in the file: its shape names the disagreement."""
    write_family_checkpoint("qwen3_moe", tmp_path)
    _write_config(tmp_path, {**_config(tmp_path), "num_local_experts": 6})
    with pytest.raises(ShapeMismatchError, match=r"tensor 'model\.layers\.0\.mlp\.gate\.weight' in .*: expected "
                       r"shape \(6, 64\) for model\.layers\.0\.mlp\.gate, found \(4, 64\)"):
        load(tmp_path)


def test_num_experts_smaller_than_the_checkpoints_is_named(tmp_path):
    write_family_checkpoint("qwen3_moe", tmp_path)
    _write_config(tmp_path, {**_config(tmp_path), "num_local_experts": 3})
    with pytest.raises(UnexpectedWeightError, match=r"tensor 'model\.layers\.0\.mlp\.experts\.3\.\w+\.weight' in "
                       r".*: expert 3 is out of range, the config says num_experts=3 \(experts 0\.\.2\)"):
        load(tmp_path)


def test_expert_parallel_over_more_ranks_than_experts_is_refused(tmp_path):
    write_family_checkpoint("qwen3_moe", tmp_path, num_local_experts=2)
    with simulated_tp(0, 4), pytest.raises(UnsupportedError, match=r"model\.layers\.0\.mlp\.experts: "
                                                                 r"enable_expert_parallel places whole experts on "
                                                                 r"ranks, but tensor parallel size 4 is larger than "
                                                                 r"num_experts=2"):
        loader.load_model(str(tmp_path), dtype="float32", enable_expert_parallel=True)


def test_tensor_parallel_that_cannot_split_the_experts_is_refused(tmp_path):
    write_family_checkpoint("qwen3_moe", tmp_path, moe_intermediate_size=30)
    with simulated_tp(0, 4), pytest.raises(UnsupportedError, match=r"model\.layers\.0\.mlp\.experts: "
                                                                 r"moe_intermediate_size=30 is not divisible by "
                                                                 r"tensor parallel size 4"):
        load(tmp_path)
