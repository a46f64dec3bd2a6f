"""Mistral checkpoints in Hugging Face's layout load and give transformers' logits, windows included."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.model_checks import (
    assert_cache_matches_full,
    assert_logits_match,
    load,
    write_family_checkpoint,
)


@pytest.fixture(scope="module")
def windowed_checkpoint(tmp_path_factory):
    """GQA with a sliding window of 4, shorter than the 12 test tokens, so the window matters."""
    path = tmp_path_factory.mktemp("mistral")
    return path, write_family_checkpoint("mistral", path, sliding_window=4)


def test_no_window_matches_transformers(tmp_path):
    reference = write_family_checkpoint("mistral", tmp_path)
    model = load(tmp_path)
    assert all(layer.self_attn.attn.sliding_window is None for layer in model.model.layers)
    assert_logits_match(model, reference)


def test_sliding_window_matches_transformers(windowed_checkpoint):
    path, reference = windowed_checkpoint
    model = load(path)
    assert all(layer.self_attn.attn.sliding_window == 4 for layer in model.model.layers)
    assert_logits_match(model, reference)


def test_sliding_window_in_bfloat16(windowed_checkpoint):
    path, reference = windowed_checkpoint
    assert_logits_match(load(path, "bfloat16"), reference, dtype=torch.bfloat16)


def test_cache_decoding_past_the_window(windowed_checkpoint):
    path, reference = windowed_checkpoint
    assert_cache_matches_full(load(path), reference.config.vocab_size, prompt=5, steps=4)
