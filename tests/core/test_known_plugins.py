"""The core's table of first-party plugins: errors name the distribution to install, or why it is off."""

from __future__ import annotations

import pytest

from loader._known_plugins import KNOWN_PLUGINS, missing_plugin_hint, provider_of
from loader._plugins import PluginRecord, create_plugin_host, use_plugin_host
from loader.hookspecs import hookimpl


@pytest.mark.parametrize(("kind", "value", "distribution"), [
    ("format", "safetensors", "loader-plugin-safetensors"),
    ("format", "pt", "loader-plugin-safetensors"),
    ("format", "gguf", "loader-plugin-gguf"),
    ("format", "runai_streamer", "loader-plugin-runai"),
    ("format", "runai_streamer_sharded", "loader-plugin-runai"),
    ("quantization", "bitsandbytes", "loader-plugin-bnb"),
    ("quantization", "gptq", "loader-plugin-marlin"),
    ("quantization", "awq", "loader-plugin-marlin"),
    ("quantization", "compressed-tensors", "loader-plugin-marlin"),
    ("scheme", "s3", "loader-plugin-runai"),
    ("architecture", "LlamaForCausalLM", "loader-plugin-llama"),
    ("architecture", "MistralForCausalLM", "loader-plugin-mistral"),
    ("architecture", "Qwen3ForCausalLM", "loader-plugin-qwen"),
    ("architecture", "GPT2LMHeadModel", "loader-plugin-transformers"),
])
def test_each_provision_has_its_distribution(kind, value, distribution):
    plugin = provider_of(kind, value)
    assert plugin is not None and plugin.distribution == distribution


def test_unknown_format_has_no_hint():
    assert provider_of("format", "tensorrt_llm") is None
    assert missing_plugin_hint("format", "tensorrt_llm") == ""


def test_names_are_unique():
    assert len({p.name for p in KNOWN_PLUGINS}) == len(KNOWN_PLUGINS)


def test_hint_says_install_disabled_or_failed():
    host = create_plugin_host(load_entry_points=False)
    assert missing_plugin_hint("format", "gguf", host) == (
        "; loader-plugin-gguf provides it: pip install loader-plugin-gguf")
    host.records["gguf"] = PluginRecord("gguf", "loader-plugin-gguf", "1", "blocked",
                                        error="LOADER_DISABLE_PLUGINS names 'gguf'")
    assert missing_plugin_hint("format", "gguf", host) == (
        "; loader-plugin-gguf provides it but is installed and disabled (LOADER_DISABLE_PLUGINS names 'gguf')")
    host.records["gguf"] = PluginRecord("gguf", "loader-plugin-gguf", "1", "failed", error="ImportError: x")
    assert missing_plugin_hint("format", "gguf", host) == (
        "; loader-plugin-gguf provides it but failed to load (ImportError: x)")
    host.records["gguf"] = PluginRecord("gguf", "loader-plugin-gguf", "1", "loaded")
    assert missing_plugin_hint("format", "gguf", host) == ""


def test_declared_and_requested_quantization_name_the_plugin():
    import torch

    from loader import _hooks
    from loader._options import LoadOptions
    from loader.errors import UnsupportedError

    host = create_plugin_host(load_entry_points=False)
    options = LoadOptions(dtype=torch.float32, device=torch.device("cpu"))
    declared = {"quantization_config": {"quant_method": "gptq"}}
    with pytest.raises(UnsupportedError, match=r"^config.json declares quantization_config.quant_method='gptq', "
                       r"which no installed plugin provides; loader-plugin-marlin provides it: "
                       r"pip install loader-plugin-marlin$"):
        _hooks.detect_quantization(declared, None, options, host)
    with pytest.raises(UnsupportedError, match=r"^quantization 'bitsandbytes' is not provided by any installed "
                       r"plugin; loader-plugin-bnb provides it: pip install loader-plugin-bnb$"):
        _hooks.detect_quantization({}, "bitsandbytes", options, host)


class _Registers:
    def __init__(self, arch: str, path: str) -> None:
        self.arch, self.path = arch, path

    @hookimpl
    def loader_register_architectures(self, register):
        register(self.arch, self.path)


def test_plugins_and_models_commands_show_a_conflict(monkeypatch, capsys, tmp_path):

    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("LOADER_OVERRIDE_ARCHITECTURES", raising=False)
    host = create_plugin_host(load_entry_points=False)
    for name in ("one", "two"):
        host.register(_Registers("ToyForCausalLM", f"{name}_pkg.model:Toy"), name)
    with use_plugin_host(host):
        _run_listings(capsys)


def _run_listings(capsys) -> None:
    import json

    from loader._cli.main import main

    assert main(["plugins"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        "conflict: architecture 'ToyForCausalLM' is registered by plugin 'two' (two_pkg.model:Toy) and plugin "
        "'one' (one_pkg.model:Toy); disable one (LOADER_DISABLE_PLUGINS) or set "
        "LOADER_OVERRIDE_ARCHITECTURES=ToyForCausalLM to let the later one win")
    assert main(["plugins", "--json"]) == 0
    records = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert records["one"]["conflicts"] == records["two"]["conflicts"] == ["ToyForCausalLM"]
    assert main(["models"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(
        "error: ToyForCausalLM: architecture 'ToyForCausalLM' is registered by plugin 'two'")

