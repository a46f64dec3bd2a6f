"""Fallback registrations and ``model_impl``: native classes win, the fallback serves the rest, at most one."""

from __future__ import annotations

import pytest

from loader._plugins import create_plugin_host
from loader._registry import ModelInfo, ModelRegistry, inspect_model_class
from loader._registry.capabilities import ModelInfoError
from loader.errors import PluginError, UnknownArchitectureError, UnsupportedError
from loader.hookspecs import hookimpl


class Registers:
    """An in-process plugin registering architectures, some of them as fallbacks."""

    def __init__(self, fallbacks: tuple[str, ...] = (), **archs: str) -> None:
        self.archs = archs
        self.fallbacks = fallbacks

    @hookimpl
    def loader_register_architectures(self, register):
        for arch, path in self.archs.items():
            register(arch, path, fallback=arch in self.fallbacks)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def registry():
    host = create_plugin_host(load_entry_points=False)
    host.register(Registers(LlamaForCausalLM="native_pkg.model:Llama"), "native")
    host.register(Registers(("AnyForCausalLM",), AnyForCausalLM="fallback_pkg.model:Any"), "anything")
    return ModelRegistry.from_host(host)


def test_native_wins_under_auto(registry):
    choice = registry.choose(["LlamaForCausalLM"])
    assert (choice.architecture, choice.entry.plugin, choice.model_impl, choice.fallback_reason) == (
        "LlamaForCausalLM", "native", "native", None)


def test_the_fallback_serves_what_no_plugin_registers(registry):
    choice = registry.choose(["GPT2LMHeadModel"])
    assert (choice.architecture, choice.entry.architecture, choice.model_impl) == (
        "GPT2LMHeadModel", "AnyForCausalLM", "transformers")
    assert choice.fallback_reason == "no installed plugin registers GPT2LMHeadModel natively"


def test_transformers_forces_the_fallback(registry):
    choice = registry.choose(["LlamaForCausalLM"], "transformers")
    assert choice.entry.plugin == "anything"
    assert choice.fallback_reason == "model_impl='transformers' was asked for"


def test_native_never_falls_back(registry):
    with pytest.raises(UnknownArchitectureError) as exc:
        registry.choose(["GPT2LMHeadModel"], "native")
    assert str(exc.value) == ("config.json architectures ['GPT2LMHeadModel']: none is registered by an installed "
                              "plugin (model_impl='native' rules out the fallback); known: LlamaForCausalLM")


def test_unknown_model_impl_is_named(registry):
    with pytest.raises(UnsupportedError, match=r"^model_impl 'vllm' is not supported; use one of auto, native, "
                                               r"transformers$"):
        registry.choose(["LlamaForCausalLM"], "vllm")


def test_transformers_without_a_fallback_says_what_to_install():
    host = create_plugin_host(load_entry_points=False)
    host.register(Registers(LlamaForCausalLM="native_pkg.model:Llama"), "native")
    with pytest.raises(UnknownArchitectureError, match=r"no installed plugin registers a fallback; "
                                                       r"loader-plugin-transformers provides it: "
                                                       r"pip install loader-plugin-transformers$"):
        ModelRegistry.from_host(host).choose(["LlamaForCausalLM"], "transformers")


def test_without_a_fallback_unknown_architectures_fail_as_before():
    host = create_plugin_host(load_entry_points=False)
    host.register(Registers(LlamaForCausalLM="native_pkg.model:Llama"), "native")
    with pytest.raises(UnknownArchitectureError, match=r"none is registered by an installed plugin; known: "
                                                       r"LlamaForCausalLM; loader-plugin-transformers .* provides it"):
        ModelRegistry.from_host(host).choose(["GPT2LMHeadModel"])


def test_two_fallbacks_name_both_plugins():
    host = create_plugin_host(load_entry_points=False)
    host.register(Registers(("A",), A="pkg_a.model:A"), "first")
    host.register(Registers(("B",), B="pkg_b.model:B"), "second")
    with pytest.raises(PluginError, match=r"two fallbacks are registered: .*'first'.*'second'|.*'second'.*'first'"):
        ModelRegistry.from_host(host)


def test_fallback_flag_must_be_a_bool():
    with pytest.raises(PluginError, match=r"fallback='yes'; expected True or False"):
        ModelRegistry().register("A", "pkg.model:A", plugin="p", fallback="yes")  # type: ignore[arg-type]


def test_fallback_entry_is_listed_and_marked(registry):
    assert registry.architectures() == ["AnyForCausalLM", "LlamaForCausalLM"]
    assert registry.fallback is not None and registry.fallback.fallback
    assert registry.entry("LlamaForCausalLM").fallback is False


class Fallback:
    fallback_architectures = ("ZForCausalLM", "AForCausalLM")


def test_model_info_reports_what_a_fallback_covers_sorted():
    info = inspect_model_class("AnyForCausalLM", Fallback)
    assert info.fallback_for == ("AForCausalLM", "ZForCausalLM")
    assert ModelInfo.from_json(info.to_json()) == info


def test_malformed_fallback_architectures_are_reported():
    class Bad:
        fallback_architectures = "AForCausalLM"

    with pytest.raises(ModelInfoError, match=r"Bad.fallback_architectures: expected architecture names"):
        inspect_model_class("X", Bad)


def test_fallback_info_is_never_read_from_the_disk_cache(registry, monkeypatch):
    probed = []

    def fake_probe(entries, packages=None):
        probed.extend(e.architecture for e in entries)
        return {e.architecture: ModelInfo(e.architecture) for e in entries}

    monkeypatch.setattr("loader._registry.probe.probe_in_child", fake_probe)
    registry.model_infos(["AnyForCausalLM"])
    assert probed == ["AnyForCausalLM"]
    folder = registry.cache.directory
    assert not folder.exists() or not any(folder.iterdir())
