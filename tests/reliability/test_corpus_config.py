"""Malformed model configs through ``loader.load_model``: refused naming the file or field, before allocating."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import loader
from loader.errors import ConfigError, UnknownArchitectureError, UnsupportedError
from tests.helpers.malformed import TINY_LLAMA, write_config, write_llama_checkpoint
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params


def _config_text(text: str | bytes, *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        write_llama_checkpoint(model)
        path = model / "config.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
        return Built(model, (str(path), *fragments))

    return build


def _config(changes: dict[str, Any], *fragments: str, drop: tuple[str, ...] = ()) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        write_llama_checkpoint(model)
        config = {k: v for k, v in {**TINY_LLAMA, **changes}.items() if k not in drop}
        write_config(model, config)
        return Built(model, fragments)

    return build


def _config_missing(folder: Path) -> Built:
    model = folder / "model"
    write_llama_checkpoint(model)
    (model / "config.json").unlink()
    return Built(model, (str(model), "no config.json"))


def _config_special(kind: str) -> Callable[[Path], Built]:
    """``config.json`` as a named pipe, or a link to ``/dev/zero``: reading either never ends."""

    def build(folder: Path) -> Built:
        model = folder / "model"
        write_llama_checkpoint(model)
        path = model / "config.json"
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to("/dev/zero")
        return Built(model, (str(model), "config.json"))

    return build


def _native_params_missing_field(folder: Path) -> Built:
    """A Mistral native folder (``params.json`` + ``consolidated.safetensors``) without ``dim``."""
    model = folder / "model"
    write_llama_checkpoint(model, shards=1)
    (model / "config.json").unlink()
    (model / "model.safetensors").rename(model / "consolidated.safetensors")
    params = {"n_layers": 2, "hidden_dim": 64, "n_heads": 4, "n_kv_heads": 2, "norm_eps": 1e-5,
              "vocab_size": 64}
    (model / "params.json").write_text(json.dumps(params))
    return Built(model, (str(model / "params.json"), "'dim'", "missing"))


ABSURD = dict(vocab_size=1 << 22, hidden_size=1 << 16, num_attention_heads=64, num_key_value_heads=64,
              intermediate_size=1 << 18, num_hidden_layers=64)
"""Every field within its plausibility bound, together about 60 TB of float32 parameters."""

CASES = [
    CorpusCase("config-missing", _config_missing, ConfigError),
    CorpusCase("config-is-a-fifo", _config_special("fifo"), ConfigError),
    CorpusCase("config-links-to-dev-zero", _config_special("zero"), ConfigError),
    CorpusCase("config-not-json", _config_text("{'single': 'quotes'}", "config.json is not valid JSON"), ConfigError),
    CorpusCase("config-not-utf8", _config_text(b'{"architectures": ["\xff"]}', "config.json is not UTF-8"),
               ConfigError),
    CorpusCase("config-not-an-object", _config_text("[1, 2]", "must be a JSON object, found list"), ConfigError),
    CorpusCase("config-nested-too-deep", _config_text("[" * 100_000, "config.json is not valid JSON"),
               ConfigError),
    CorpusCase("config-integer-too-long", _config_text('{"vocab_size": ' + "9" * 5000 + "}",
                                                       "config.json is not valid JSON"), ConfigError),
    CorpusCase("architectures-missing", _config({}, "'architectures' must be a non-empty list",
                                                 drop=("architectures",)), ConfigError),
    CorpusCase("architectures-unknown", _config({"architectures": ["GPT9ForCausalLM"]}, "'GPT9ForCausalLM'",
                                                "LlamaForCausalLM"), UnknownArchitectureError),
    CorpusCase("hidden-size-not-integer", _config({"hidden_size": "big"}, "LlamaForCausalLM",
                                                  "config field 'hidden_size' must be an integer, found 'big'"),
               ConfigError),
    CorpusCase("layers-negative", _config({"num_hidden_layers": -1}, "'num_hidden_layers'", "found -1"),
               ConfigError),
    CorpusCase("vocab-beyond-bound", _config({"vocab_size": 10**12}, "'vocab_size'", "found 1000000000000"),
               ConfigError),
    CorpusCase("required-field-missing", _config({}, "'intermediate_size' is required but missing",
                                                 drop=("intermediate_size",)), ConfigError),
    CorpusCase("kv-heads-not-dividing", _config({"num_key_value_heads": 3}, "'num_key_value_heads'=3",
                                                "'num_attention_heads'=4"), ConfigError),
    CorpusCase("eps-not-number", _config({"rms_norm_eps": "tiny"}, "'rms_norm_eps' must be a number"),
               ConfigError),
    CorpusCase("tie-not-boolean", _config({"tie_word_embeddings": "yes"}, "'tie_word_embeddings' must be true or"),
               ConfigError),
    CorpusCase("activation-unsupported", _config({"hidden_act": "gelu"}, "'hidden_act' is 'gelu'"),
               UnsupportedError),
    CorpusCase("rope-scaling-unknown", _config({"rope_scaling": {"rope_type": "warp", "factor": 2.0}},
                                               "'rope_scaling.rope_type' is 'warp'"), UnsupportedError),
    CorpusCase("qwen-layer-types-length", _config(
        {"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True, "sliding_window": 16,
         "layer_types": ["full_attention"]}, "Qwen2ForCausalLM", "'layer_types' has 1 entries"), ConfigError),
    CorpusCase("absurd-sizes", _config(ABSURD, "(LlamaForCausalLM)", "GB for its parameters on cpu",
                                       "check the config's sizes"), UnsupportedError),
    CorpusCase("mistral-params-missing-field", _native_params_missing_field, ConfigError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_malformed_config_is_refused_naming_the_field(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


def test_absurd_sizes_are_refused_before_any_parameter_is_allocated(tmp_path: Path, monkeypatch) -> None:
    from loader._pipeline import load as load_module

    def must_not_allocate(*args: object, **kwargs: object) -> None:
        raise AssertionError("parameters were allocated for an absurd config")

    monkeypatch.setattr(load_module, "materialize", must_not_allocate)
    built = _config(ABSURD)(tmp_path)
    with pytest.raises(UnsupportedError) as info:
        loader.load_model(str(built.source), dtype="bfloat16")
    hidden, layers = ABSURD["hidden_size"], ABSURD["num_hidden_layers"]
    per_layer = 4 * hidden * hidden + 3 * ABSURD["intermediate_size"] * hidden + 2 * hidden
    parameters = 2 * ABSURD["vocab_size"] * hidden + layers * per_layer + hidden
    assert f"needs {2 * parameters / 1e9:.2f} GB" in str(info.value), "the meta-built model's exact size"
