"""The core's table of first-party plugins: errors name the distribution to install, or why it is off."""

from __future__ import annotations

import pytest

from loader._known_plugins import KNOWN_PLUGINS, missing_plugin_hint, provider_of
from loader._plugins import PluginRecord, create_plugin_host


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
    ("scheme", "gs", "loader-plugin-runai"),
    ("architecture", "LlamaForCausalLM", "loader-plugin-llama"),
    ("architecture", "MistralForCausalLM", "loader-plugin-mistral"),
    ("architecture", "Qwen3ForCausalLM", "loader-plugin-qwen"),
    ("architecture", "GPT2LMHeadModel", "loader-plugin-transformers"),
])
def test_each_provision_has_its_distribution(kind, value, distribution):
    plugin = provider_of(kind, value)
    assert plugin is not None and plugin.distribution == distribution


def test_unknown_format_has_no_hint():
    assert provider_of("format", "tensorizer") is None
    assert missing_plugin_hint("format", "tensorizer") == ""


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
