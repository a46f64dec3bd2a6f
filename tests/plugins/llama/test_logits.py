"""Llama checkpoints written by transformers load through the pipeline and give transformers' logits."""

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
def llama_checkpoint(tmp_path_factory):
    """The family preset: GQA (4 heads, 2 KV heads), llama3 rope scaling, untied head, 12 shards."""
    path = tmp_path_factory.mktemp("llama")
    return path, write_family_checkpoint("llama", path)


def test_float32_logits_match_transformers(llama_checkpoint):
    path, reference = llama_checkpoint
    assert len(list(path.glob("*.safetensors"))) > 1
    model = load(path, "float32")
    assert model.config.rope.rope_type == "llama3"
    assert not model.config.tie_word_embeddings
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert_logits_match(model, reference)


def test_bfloat16_logits_stay_close_to_float32_reference(llama_checkpoint):
    path, reference = llama_checkpoint
    model = load(path, "bfloat16")
    assert model.model.layers[0].self_attn.qkv_proj.weight.dtype == torch.bfloat16
    assert_logits_match(model, reference, dtype=torch.bfloat16)


def test_incremental_decoding_with_cache_equals_full_forward(llama_checkpoint):
    path, reference = llama_checkpoint
    assert_cache_matches_full(load(path), reference.config.vocab_size)


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param(dict(rope_scaling=None), id="default-rope"),
        pytest.param(dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), id="linear-rope"),
        # dynamic NTK only changes anything past max_position_embeddings: the 12 tokens exceed 8
        pytest.param(dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=8),
                     id="dynamic-rope"),
        pytest.param(dict(attention_bias=True, mlp_bias=True, head_dim=32, tie_word_embeddings=True),
                     id="biases-head_dim-tied"),
    ],
)
def test_config_variants_match_transformers(tmp_path, overrides):
    reference = write_family_checkpoint("llama", tmp_path, **overrides)
    model = load(tmp_path)
    if overrides.get("tie_word_embeddings"):
        assert model.lm_head.weight is model.model.embed_tokens.weight
        assert model.model.layers[0].self_attn.o_proj.bias is not None
    assert_logits_match(model, reference)


@pytest.mark.parametrize(
    ("rope_parameters", "rope_scaling", "top_level"),
    [
        pytest.param({"rope_type": "default", "rope_theta": 500000.0}, {"rope_type": "linear", "factor": 4.0},
                     {}, id="scaling-replaces-parameters-theta-defaults"),
        pytest.param({"rope_type": "default", "rope_theta": 500000.0}, {"type": "linear", "factor": 4.0},
                     {"rope_theta": 20000.0}, id="scaling-takes-top-level-theta"),
        pytest.param({"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0},
                     {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 3000.0}, {}, id="scaling-own-theta"),
        pytest.param({"rope_type": "linear", "factor": 4.0, "rope_theta": 500000.0}, {}, {},
                     id="empty-scaling-is-ignored"),
    ],
)
def test_rope_scaling_beside_rope_parameters_follows_transformers(tmp_path, rope_parameters, rope_scaling,
                                                                  top_level):
    """A hand-edited transformers-5 config holding both spellings: loader picks what transformers 5.24 does.

    transformers' ``convert_rope_params_to_dict`` takes ``rope_scaling or rope_parameters`` (a non-empty
    ``rope_scaling`` replaces ``rope_parameters`` whole) and fills ``rope_theta`` from the chosen dict,
    else the top-level ``rope_theta``, else 10000.
    """
    import json

    import transformers

    write_family_checkpoint("llama", tmp_path, rope_scaling=None, max_position_embeddings=8)
    config_path = tmp_path / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("rope_scaling", None)
    config.pop("rope_theta", None)
    config.update(rope_parameters=rope_parameters, rope_scaling=rope_scaling, **top_level)
    config_path.write_text(json.dumps(config))
    reference = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    assert_logits_match(load(tmp_path), reference)
