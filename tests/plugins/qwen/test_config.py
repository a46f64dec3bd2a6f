"""Qwen2/Qwen3 config parsing: biases, and sliding windows with transformers' per-layer semantics."""

from __future__ import annotations

import pytest

from loader.errors import ConfigError
from loader_plugin_qwen.config import parse_qwen2_config, parse_qwen3_config

BASE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6)


def test_qwen2_has_qkv_bias_but_no_o_bias():
    config = parse_qwen2_config(BASE)
    assert config.qkv_bias and not config.o_proj_bias and not config.mlp_bias


def test_qwen3_bias_follows_attention_bias_and_head_dim_comes_from_config():
    config = parse_qwen3_config({**BASE, "head_dim": 32})
    assert config.head_dim == 32 and not config.qkv_bias
    biased = parse_qwen3_config({**BASE, "attention_bias": True})
    assert biased.qkv_bias and biased.o_proj_bias


@pytest.mark.parametrize("parse", [parse_qwen2_config, parse_qwen3_config])
def test_window_is_ignored_unless_use_sliding_window(parse):
    config = parse({**BASE, "sliding_window": 4096, "use_sliding_window": False, "max_window_layers": 0})
    assert [config.sliding_window(i) for i in range(4)] == [None] * 4


@pytest.mark.parametrize("parse", [parse_qwen2_config, parse_qwen3_config])
def test_layers_from_max_window_layers_on_slide_without_layer_types(parse):
    config = parse({**BASE, "sliding_window": 8, "use_sliding_window": True, "max_window_layers": 2})
    assert [config.sliding_window(i) for i in range(4)] == [None, None, 8, 8]


def test_layer_types_win_over_max_window_layers():
    kinds = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
    config = parse_qwen2_config({**BASE, "sliding_window": 8, "use_sliding_window": True,
                                 "max_window_layers": 0, "layer_types": kinds})
    assert [config.sliding_window(i) for i in range(4)] == [8, None, 8, None]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"layer_types": ["full_attention"]}, "'layer_types' has 1 entries for num_hidden_layers=4"),
        ({"layer_types": ["full_attention", "chunked", "full_attention", "full_attention"]},
         "'layer_types[1]' must be 'full_attention' or 'sliding_attention', found 'chunked'"),
        ({"sliding_window": -5}, "'sliding_window' must be an integer in"),
        ({"use_sliding_window": 1}, "'use_sliding_window' must be true or false"),
        ({"max_window_layers": "all", "layer_types": None}, "'max_window_layers' must be an integer"),
    ],
)
def test_bad_window_fields_are_named(changes, message):
    with pytest.raises(ConfigError, match=r"^Qwen2ForCausalLM: ") as info:
        parse_qwen2_config({**BASE, "sliding_window": 8, "use_sliding_window": True, **changes})
    assert message in str(info.value)
