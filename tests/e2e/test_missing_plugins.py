"""Errors name the plugin distribution to install (or why it is off); one duplicate architecture breaks only itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import loader
from loader._plugins import create_plugin_host
from loader.errors import PluginError, SourceNotFoundError, UnknownArchitectureError
from loader.hookspecs import hookimpl
from tests.helpers.hf_checkpoints import build_model, save_checkpoint, tiny_config


class RogueLlama:
    """A second plugin claiming ``LlamaForCausalLM`` with the Mistral plugin's class."""

    @hookimpl
    def loader_register_architectures(self, register):
        register("LlamaForCausalLM", "loader_plugin_mistral.model:MistralForCausalLM")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("missing")
    save_checkpoint("llama", root / "llama")
    save_checkpoint("qwen2", root / "qwen2")
    return {"llama": root / "llama", "qwen2": root / "qwen2"}


def test_disabled_safetensors_plugin_is_named(checkpoints):
    host = create_plugin_host(environ={"LOADER_DISABLE_PLUGINS": "safetensors"})
    with pytest.raises(SourceNotFoundError) as err:
        loader.load_model(str(checkpoints["llama"]), host=host)
    assert str(err.value).endswith(
        "no weight files any installed format plugin recognises (safetensors files); loader-plugin-safetensors "
        "provides it but is installed and disabled (LOADER_DISABLE_PLUGINS names 'safetensors')")


def test_plugin_left_out_of_the_allow_list_is_named(checkpoints):
    host = create_plugin_host(environ={"LOADER_PLUGINS": "safetensors,llama"})
    with pytest.raises(UnknownArchitectureError, match=r"config.json architectures \['Qwen2ForCausalLM'\]: .*"
                       r"loader-plugin-qwen provides it but is installed and disabled "
                       r"\(LOADER_PLUGINS does not name 'qwen'\)"):
        loader.load_model(str(checkpoints["qwen2"]), host=host)


def test_qwen_gguf_without_the_qwen_plugin_talks_about_the_gguf_file(tmp_path):
    from tests.helpers.gguf_files import write_gguf

    path = write_gguf(tmp_path / "model.gguf", build_model("qwen2", tiny_config("qwen2", vocab_size=288)), "qwen2")
    # the transformers fallback would serve Qwen2 itself: block it too, as a user without it would be
    host = create_plugin_host(environ={"LOADER_DISABLE_PLUGINS": "qwen,transformers"})
    with pytest.raises(UnknownArchitectureError) as err:
        loader.load_model(str(path), host=host)
    message = str(err.value)
    assert message.startswith("GGUF file model.gguf (metadata general.architecture): architectures "
                              "['Qwen2ForCausalLM']")
    assert "config.json" not in message and "loader-plugin-qwen" in message


def test_unknown_uri_scheme_names_the_plugin():
    host = create_plugin_host(load_entry_points=False)
    with pytest.raises(SourceNotFoundError, match=r"^s3://bucket/model: no installed plugin opens s3:// URIs; "
                       r"loader-plugin-runai provides it: pip install loader-plugin-runai$"):
        loader.load_model("s3://bucket/model", host=host)


def test_second_llama_registration_leaves_other_architectures_loadable(checkpoints, monkeypatch):
    monkeypatch.delenv("LOADER_OVERRIDE_ARCHITECTURES", raising=False)
    host = create_plugin_host()
    host.register(RogueLlama(), "rogue")
    model = loader.load_model(str(checkpoints["qwen2"]), dtype="float32", host=host)
    assert model(torch.tensor([[1, 2, 3]])).shape[:2] == (1, 3)
    with pytest.raises(PluginError, match=r"architecture 'LlamaForCausalLM' is registered by plugin 'rogue' .* "
                       r"and plugin 'llama' .*LOADER_OVERRIDE_ARCHITECTURES=LlamaForCausalLM"):
        loader.load_model(str(checkpoints["llama"]), host=host)


def test_override_lets_the_later_llama_registration_win_with_a_warning(checkpoints, monkeypatch, caplog):
    monkeypatch.setenv("LOADER_OVERRIDE_ARCHITECTURES", "LlamaForCausalLM")
    host = create_plugin_host()
    host.register(RogueLlama(), "rogue")
    with caplog.at_level("WARNING", logger="loader"):
        model = loader.load_model(str(checkpoints["llama"]), dtype="float32", host=host)
    assert type(model).__name__ == "MistralForCausalLM"
    assert any("plugin 'rogue' (loader_plugin_mistral.model:MistralForCausalLM) overrides plugin 'llama'"
               in r.getMessage() for r in caplog.records)


def test_safetensors_folder_without_the_plugin_installed_says_what_to_install(checkpoints):
    """As in a venv with only loader-core, -gguf and -llama: no record of the safetensors plugin at all."""
    import loader_plugin_gguf.plugin
    import loader_plugin_llama.plugin

    host = create_plugin_host(load_entry_points=False)
    host.register(loader_plugin_gguf.plugin, "gguf", distribution="loader-plugin-gguf")
    host.register(loader_plugin_llama.plugin, "llama", distribution="loader-plugin-llama")
    with pytest.raises(SourceNotFoundError) as err:
        loader.load_model(str(checkpoints["llama"]), host=host)
    assert str(err.value) == (
        f"{checkpoints['llama']}: no weight files any installed format plugin recognises (safetensors files); "
        "loader-plugin-safetensors provides it: pip install loader-plugin-safetensors")
