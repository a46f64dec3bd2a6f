"""Qwen2 and Qwen3 checkpoints written by transformers load and give transformers' logits."""

from __future__ import annotations

import json

import pytest
import torch

from tests.helpers.model_checks import (
    assert_cache_matches_full,
    assert_logits_match,
    load,
    write_family_checkpoint,
)


@pytest.fixture(scope="module")
def qwen2_checkpoint(tmp_path_factory):
    """The family preset: tied embeddings, QKV bias (randomised), GQA."""
    path = tmp_path_factory.mktemp("qwen2")
    return path, write_family_checkpoint("qwen2", path)


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    """The family preset: q/k norms, head_dim 32 (not hidden / heads), untied."""
    path = tmp_path_factory.mktemp("qwen3")
    return path, write_family_checkpoint("qwen3", path)


def test_qwen2_tied_with_qkv_bias_matches_transformers(qwen2_checkpoint):
    path, reference = qwen2_checkpoint
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert "lm_head.weight" not in index["weight_map"]  # tied: transformers does not save the head
    model = load(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    attn = model.model.layers[0].self_attn
    assert attn.qkv_proj.bias is not None and attn.o_proj.bias is None
    q_bias = reference.state_dict()["model.layers.0.self_attn.q_proj.bias"]
    assert torch.equal(attn.qkv_proj.bias[:64], q_bias)
    assert_logits_match(model, reference)


def test_qwen2_bfloat16(qwen2_checkpoint):
    path, reference = qwen2_checkpoint
    assert_logits_match(load(path, "bfloat16"), reference, dtype=torch.bfloat16)


def test_qwen2_cache_decoding(qwen2_checkpoint):
    path, reference = qwen2_checkpoint
    assert_cache_matches_full(load(path), reference.config.vocab_size)


def test_qwen2_sliding_window_on_upper_layers_matches_transformers(tmp_path):
    reference = write_family_checkpoint(
        "qwen2", tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=1
    )
    model = load(tmp_path)
    assert [layer.self_attn.attn.sliding_window for layer in model.model.layers] == [None, 4]
    assert_logits_match(model, reference)
    assert_cache_matches_full(model, reference.config.vocab_size)


def test_qwen3_matches_transformers(qwen3_checkpoint):
    path, reference = qwen3_checkpoint
    model = load(path)
    attn = model.model.layers[1].self_attn
    assert attn.head_dim == 32 and attn.qkv_proj.bias is None
    assert torch.equal(attn.k_norm.weight, reference.state_dict()["model.layers.1.self_attn.k_norm.weight"])
    assert_logits_match(model, reference)


def test_qwen3_bfloat16(qwen3_checkpoint):
    path, reference = qwen3_checkpoint
    assert_logits_match(load(path, "bfloat16"), reference, dtype=torch.bfloat16)


def test_qwen3_cache_decoding(qwen3_checkpoint):
    path, reference = qwen3_checkpoint
    assert_cache_matches_full(load(path), reference.config.vocab_size)
