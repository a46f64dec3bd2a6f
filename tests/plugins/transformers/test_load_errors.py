"""Bad input to the fallback: each a one-line error naming what is wrong."""

from __future__ import annotations

import json
import re

import pytest
from safetensors.torch import load_file, save_file

import loader
from loader._plugins import create_plugin_host
from loader.errors import (
    LoadError,
    MissingWeightsError,
    UnexpectedWeightError,
    UnknownArchitectureError,
    UnsupportedError,
)
from loader.hookspecs import hookimpl
from loader.layers.quantization import QuantizationConfig
from tests.helpers.hf_fallback_checkpoints import save_fallback_checkpoint


def _one_line(exc: pytest.ExceptionInfo[LoadError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def _edit_config(folder, **changes) -> None:
    path = folder / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


def _rewrite_single_file(folder, edit) -> None:
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_architecture_neither_native_nor_known_to_transformers(tmp_path):
    save_fallback_checkpoint(tmp_path, "gpt2")
    _edit_config(tmp_path, architectures=["NoSuchForCausalLM"], model_type="nosuch")
    with pytest.raises(UnknownArchitectureError) as exc:
        loader.load_model(str(tmp_path))
    assert re.fullmatch(r"architecture 'NoSuchForCausalLM' is not registered by any installed plugin, and "
                        r"transformers 5\.\S+ has no causal-LM class of that name \(model_type 'nosuch'\)",
                        _one_line(exc))


def test_an_unknown_architecture_is_not_guessed_from_model_type(tmp_path):
    save_fallback_checkpoint(tmp_path, "gpt2")
    _edit_config(tmp_path, architectures=["GPT2ForTokenClassification"])
    with pytest.raises(UnknownArchitectureError) as exc:
        loader.load_model(str(tmp_path))
    assert _one_line(exc).endswith("has no causal-LM class of that name (its model_type 'gpt2' has "
                                   "GPT2LMHeadModel: list that in architectures to load it as one)")


def test_missing_tensor_is_named(tmp_path):
    save_fallback_checkpoint(tmp_path, "gemma", max_shard_size="10MB")
    _rewrite_single_file(tmp_path, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(MissingWeightsError) as exc:
        loader.load_model(str(tmp_path))
    assert _one_line(exc) == ("the checkpoint has no tensor for model.layers.1.mlp.up_proj.weight, which "
                              "transformers' GemmaForCausalLM needs")


def test_unexpected_tensor_is_named(tmp_path):
    import torch

    save_fallback_checkpoint(tmp_path, "gemma", max_shard_size="10MB")
    _rewrite_single_file(tmp_path, lambda t: t.update({"model.layers.0.extra.weight": torch.zeros(2)}))
    with pytest.raises(UnexpectedWeightError, match=r"'model.layers.0.extra.weight'.*transformers' GemmaForCausalLM "
                                                    r"has no parameter or buffer"):
        loader.load_model(str(tmp_path))


def test_wrong_shape_is_named(tmp_path):
    import torch

    save_fallback_checkpoint(tmp_path, "gemma", max_shard_size="10MB")
    _rewrite_single_file(tmp_path, lambda t: t.update({"model.norm.weight": torch.zeros(3)}))
    with pytest.raises(LoadError, match=r"'model.norm.weight'.*expected shape \(64,\).*found \(3,\)"):
        loader.load_model(str(tmp_path))


def test_tensor_parallel_without_a_plan_names_the_architecture(tmp_path):
    from loader._distributed import simulated_tp

    save_fallback_checkpoint(tmp_path, "gpt2")
    with simulated_tp(0, 2), pytest.raises(UnsupportedError) as exc:
        loader.load_model(str(tmp_path))
    assert _one_line(exc).startswith("GPT2LMHeadModel: tensor parallel size 2 needs a base_model_tp_plan")


def test_tensor_parallel_with_heads_that_do_not_split_names_the_field(tmp_path):
    from loader._distributed import simulated_tp

    # fewer KV heads than ranks are replicated; more that tp does not divide cannot be split
    save_fallback_checkpoint(tmp_path, "granite", hidden_size=48, num_attention_heads=6, num_key_value_heads=3)
    with simulated_tp(0, 2), pytest.raises(UnsupportedError) as exc:
        loader.load_model(str(tmp_path))
    assert _one_line(exc) == "GraniteForCausalLM: num_key_value_heads=3 is not divisible by tensor parallel size 2"


class _OtherQuantization(QuantizationConfig):
    name = "gptq"


class _OtherQuantizationPlugin:
    @hookimpl
    def loader_detect_quantization(self, hf_config, requested, options):
        return _OtherQuantization() if requested == "gptq" else None


def test_quantization_other_than_bitsandbytes_needs_a_native_class(tmp_path):
    save_fallback_checkpoint(tmp_path, "olmo2")
    host = create_plugin_host()
    host.register(_OtherQuantizationPlugin(), "other-quant")
    with pytest.raises(UnsupportedError) as exc:
        loader.load_model(str(tmp_path), quantization="gptq", host=host)
    assert _one_line(exc) == ("Olmo2ForCausalLM loads through the transformers fallback, which quantizes only "
                              "with bitsandbytes; quantization 'gptq' needs a native model class for Olmo2ForCausalLM")


def test_config_without_model_type_uses_the_class_config(tmp_path):
    import torch

    reference = save_fallback_checkpoint(tmp_path, "stablelm")
    config = json.loads((tmp_path / "config.json").read_text())
    del config["model_type"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = loader.load_model(str(tmp_path), dtype="float32")
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(input_ids=ids).logits, atol=1e-5, rtol=0)
