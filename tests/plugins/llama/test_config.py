"""LlamaConfig parsing: both rope spellings, defaults, and a ConfigError naming each bad field."""

from __future__ import annotations

import pytest

from loader.errors import ConfigError, UnsupportedError
from loader_plugin_llama.config import parse_llama_config

BASE = dict(
    architectures=["LlamaForCausalLM"], vocab_size=256, hidden_size=64, intermediate_size=128,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


def parse(**changes):
    return parse_llama_config({**BASE, **changes})


def test_defaults_and_derived_head_dim():
    config = parse()
    assert config.head_dim == 16
    assert config.num_key_value_heads == 2
    assert config.rope.theta == 10000.0 and config.rope.scaling is None
    assert config.max_position_embeddings == 2048
    assert not (config.tie_word_embeddings or config.qkv_bias or config.o_proj_bias or config.mlp_bias)
    assert config.sliding_window(1) is None


def test_kv_heads_default_to_query_heads():
    assert parse(num_key_value_heads=None).num_key_value_heads == 4


def test_explicit_head_dim_wins_over_hidden_over_heads():
    assert parse(head_dim=32).head_dim == 32


def test_attention_bias_sets_qkv_and_o_bias():
    config = parse(attention_bias=True, mlp_bias=True)
    assert config.qkv_bias and config.o_proj_bias and config.mlp_bias


def test_rope_parameters_of_transformers_5():
    config = parse(rope_parameters={"rope_theta": 500000.0, **LLAMA3})
    assert config.rope.theta == 500000.0
    assert config.rope.scaling == LLAMA3


def test_rope_theta_and_rope_scaling_of_transformers_4():
    legacy = {"type": "linear", "factor": 2.0}
    config = parse(rope_theta=1e6, rope_scaling=legacy)
    assert config.rope.theta == 1e6
    assert config.rope.scaling == {"rope_type": "linear", "factor": 2.0}


def test_default_rope_type_means_no_scaling():
    assert parse(rope_parameters={"rope_theta": 1.0, "rope_type": "default"}).rope.scaling is None


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": "64"}, "'hidden_size' must be an integer, found '64'"),
        ({"hidden_size": True}, "'hidden_size' must be an integer"),
        ({"vocab_size": 1 << 40}, "'vocab_size' must be an integer in [1, 4194304]"),
        ({"num_hidden_layers": 0}, "'num_hidden_layers' must be an integer in [1, 1024]"),
        ({"intermediate_size": None}, "'intermediate_size' is required but missing"),
        ({"rms_norm_eps": -1.0}, "'rms_norm_eps' must be a number above 0.0"),
        ({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or false"),
        ({"num_key_value_heads": 3}, "'num_key_value_heads'=3 must divide 'num_attention_heads'=4"),
        ({"num_attention_heads": 3, "num_key_value_heads": 1},
         "'hidden_size'=64 is not divisible by 'num_attention_heads'=3"),
        ({"head_dim": 15}, "head size 15 must be even"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}},
         "'rope_scaling.low_freq_factor' is required for rope_type 'llama3'"),
        ({"rope_parameters": {**LLAMA3, "factor": -1}}, "'rope_parameters.factor' must be a positive number"),
        ({"rope_parameters": {**LLAMA3, "original_max_position_embeddings": 6.5}},
         "'rope_parameters.original_max_position_embeddings' must be a positive integer"),
        ({"rope_parameters": "fast"}, "'rope_parameters' must be an object"),
    ],
)
def test_bad_fields_are_named(changes, message):
    with pytest.raises(ConfigError) as info:
        parse(**changes)
    assert message in str(info.value)
    assert str(info.value).startswith("LlamaForCausalLM: ")


def test_unsupported_rope_type_and_activation():
    with pytest.raises(UnsupportedError, match=r"'rope_scaling\.rope_type' is 'yarn'; supported rotary"):
        parse(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(UnsupportedError, match="'hidden_act' is 'gelu'; only 'silu'"):
        parse(hidden_act="gelu")


def test_config_must_be_a_mapping():
    with pytest.raises(ConfigError, match="must be a mapping, found list"):
        parse_llama_config([1, 2])  # type: ignore[arg-type]
