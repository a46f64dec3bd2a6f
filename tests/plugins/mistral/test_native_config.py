"""params.json becomes a Hugging Face-style config, read only for native folders."""

from __future__ import annotations

import json

import pytest

from loader._hooks import read_config
from loader._plugins import create_plugin_host
from loader.checkpoint import Source, WeightFormat
from loader.errors import ConfigError, UnsupportedError
from loader_plugin_mistral.model import parse_mistral_config
from loader_plugin_mistral.native_config import native_params_to_hf

PARAMS = {"dim": 64, "n_layers": 2, "head_dim": 16, "hidden_dim": 128, "n_heads": 4, "n_kv_heads": 2,
          "norm_eps": 1e-5, "vocab_size": 256, "rope_theta": 1e6}


def _folder(tmp_path, params=PARAMS, *, config_json=False):
    (tmp_path / "params.json").write_text(json.dumps(params))
    (tmp_path / "consolidated.safetensors").write_bytes(b"")
    if config_json:
        (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"]}))
    source = Source(location=str(tmp_path), path=tmp_path)
    return source, WeightFormat(name="safetensors", files=(str(tmp_path / "consolidated.safetensors"),))


def test_translation_names_the_architecture_and_leaves_the_layout_to_the_format():
    config = native_params_to_hf({**PARAMS, "sliding_window": 4096, "tied_embeddings": True}, "params.json")
    assert config["architectures"] == ["MistralForCausalLM"]
    assert "loader_checkpoint_layout" not in config  # the format renames, no config key triggers it
    parsed = parse_mistral_config(config)
    assert (parsed.hidden_size, parsed.num_hidden_layers, parsed.intermediate_size) == (64, 2, 128)
    assert (parsed.num_attention_heads, parsed.num_key_value_heads, parsed.head_dim) == (4, 2, 16)
    assert parsed.rope.theta == 1e6 and parsed.rms_norm_eps == 1e-5
    assert parsed.tie_word_embeddings
    assert parsed.sliding_window(0) == parsed.sliding_window(1) == 4096
    assert parsed.max_position_embeddings == 32768


def test_plugin_hook_answers_for_a_native_folder_before_the_core(tmp_path):
    source, fmt = _folder(tmp_path)
    config = read_config(source, fmt, create_plugin_host())
    assert config["model_type"] == "mistral"
    assert config["num_key_value_heads"] == 2


def test_folder_with_config_json_is_left_to_the_core(tmp_path):
    source, fmt = _folder(tmp_path, config_json=True)
    config = read_config(source, fmt, create_plugin_host())
    assert config == {"architectures": ["MistralForCausalLM"]}


def test_other_weight_files_are_not_claimed(tmp_path):
    source, _ = _folder(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["X"]}))
    gguf = WeightFormat(name="gguf", files=(str(tmp_path / "model.gguf"),))
    from loader_plugin_mistral.plugin import loader_read_config

    assert loader_read_config(source, gguf) is None


@pytest.mark.parametrize(
    ("changes", "error", "message"),
    [
        ({"moe": {"num_experts": 8}}, UnsupportedError, "field 'moe' declares mixture-of-experts"),
        ({"vision_encoder": {}}, UnsupportedError, "field 'vision_encoder' declares vision encoders"),
        ({"sliding_window": [4096, 8192]}, UnsupportedError, "'sliding_window' is a per-layer list"),
        ({"dim": None}, ConfigError, "required field(s) 'dim' missing"),
    ],
)
def test_unsupported_or_incomplete_params_are_refused(tmp_path, changes, error, message):
    source, fmt = _folder(tmp_path, {**PARAMS, **changes})
    with pytest.raises(error) as info:
        read_config(source, fmt, create_plugin_host())
    assert message in str(info.value)
    assert str(tmp_path / "params.json") in str(info.value)


def test_bad_field_in_params_is_named_by_its_config_name(tmp_path):
    config = native_params_to_hf({**PARAMS, "n_heads": "four"}, "params.json")
    with pytest.raises(ConfigError, match="'num_attention_heads' must be an integer, found 'four'"):
        parse_mistral_config(config)


def test_params_json_linking_out_of_the_folder_is_refused(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    source, weights = _folder(model)
    (tmp_path / "elsewhere.json").write_text((model / "params.json").read_text())
    (model / "params.json").unlink()
    (model / "params.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(ConfigError, match=r"params\.json resolves to .*elsewhere\.json, outside the model folder"):
        read_config(source, weights, create_plugin_host())
