"""The registry's bookkeeping: registration through the hook, duplicates, resolve, ModelInfo from a class."""

from __future__ import annotations

import subprocess
import uuid
from typing import ClassVar

import pytest

from loader._interfaces import SupportsPipelineParallel, SupportsQuantization, SupportsTensorParallel
from loader._plugins import create_plugin_host, use_plugin_host
from loader._registry import ModelInfo, ModelRegistry, RegisteredModel, get_registry, inspect_model_class
from loader._registry.capabilities import ModelInfoError
from loader.errors import PluginError, UnknownArchitectureError
from loader.hookspecs import hookimpl
from tests.helpers.toy_models import TOY_WITHOUT_TORCH, forget_module, write_module


class Registers:
    """An in-process plugin registering the given architectures."""

    def __init__(self, **archs: str) -> None:
        self.archs = archs

    @hookimpl
    def loader_register_architectures(self, register):
        for arch, path in self.archs.items():
            register(arch, path)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADER_PROBE_IN_PROCESS", raising=False)


@pytest.fixture
def host():
    return create_plugin_host(load_entry_points=False)


@pytest.fixture
def toy_module(tmp_path, monkeypatch):
    """A toy model module importable in this process (and the probe child); removed afterwards."""
    name = f"regtoy_{uuid.uuid4().hex[:12]}"
    write_module(tmp_path, name, TOY_WITHOUT_TORCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    forget_module(name)


def test_plugin_registers_through_the_hook_without_importing(host):
    host.register(Registers(ToyForCausalLM="never_imported_pkg.model:ToyForCausalLM"), "toyplugin")
    registry = ModelRegistry.from_host(host)
    assert registry.architectures() == ["ToyForCausalLM"]
    assert registry.entry("ToyForCausalLM") == RegisteredModel(
        architecture="ToyForCausalLM", plugin="toyplugin",
        class_path="never_imported_pkg.model:ToyForCausalLM",
    )
    assert registry.entries() == [registry.entry("ToyForCausalLM")]


def test_entries_are_sorted_across_plugins(host):
    host.register(Registers(ZedForCausalLM="z.m:Z"), "zed")
    host.register(Registers(AlphaForCausalLM="a.m:A", MidForCausalLM="m.m:M"), "alpha")
    registry = ModelRegistry.from_host(host)
    assert registry.architectures() == ["AlphaForCausalLM", "MidForCausalLM", "ZedForCausalLM"]
    assert [e.plugin for e in registry.entries()] == ["alpha", "alpha", "zed"]


def test_duplicate_architecture_is_a_conflict_of_that_architecture_only(host, monkeypatch):
    monkeypatch.delenv("LOADER_OVERRIDE_ARCHITECTURES", raising=False)
    host.register(Registers(ToyForCausalLM="first_pkg.model:Toy", OtherForCausalLM="o.m:O"), "first")
    host.register(Registers(ToyForCausalLM="second_pkg.model:Toy"), "second")
    registry = ModelRegistry.from_host(host)
    assert registry.entry("OtherForCausalLM").plugin == "first"
    with pytest.raises(PluginError) as err:
        registry.entry("ToyForCausalLM")
    message = str(err.value)
    assert "'ToyForCausalLM'" in message
    assert "'first'" in message and "'second'" in message
    assert "first_pkg.model:Toy" in message and "second_pkg.model:Toy" in message
    assert "LOADER_OVERRIDE_ARCHITECTURES=ToyForCausalLM" in message
    assert list(registry.conflicts()) == ["ToyForCausalLM"]
    with pytest.raises(PluginError, match="registered by plugin"):
        registry.resolve(["ToyForCausalLM"])
    assert isinstance(registry.model_infos_or_errors(["ToyForCausalLM"])["ToyForCausalLM"], PluginError)


@pytest.mark.parametrize("setting", ["ToyForCausalLM", " Other , ToyForCausalLM", "*"])
def test_override_setting_lets_the_later_registration_win_with_a_warning(host, monkeypatch, caplog, setting):
    monkeypatch.setenv("LOADER_OVERRIDE_ARCHITECTURES", setting)
    host.register(Registers(ToyForCausalLM="first_pkg.model:Toy"), "first")
    host.register(Registers(ToyForCausalLM="second_pkg.model:Toy"), "second")
    with caplog.at_level("WARNING", logger="loader._registry"):
        registry = ModelRegistry.from_host(host)
    assert registry.entry("ToyForCausalLM").plugin == "second"  # registered later: asked first
    assert registry.conflicts() == {}
    assert [r.getMessage() for r in caplog.records] == [
        "architecture 'ToyForCausalLM': plugin 'second' (second_pkg.model:Toy) overrides plugin 'first' "
        "(first_pkg.model:Toy) because LOADER_OVERRIDE_ARCHITECTURES names it"
    ]


def test_unknown_architecture_names_the_plugin_to_install():
    host = create_plugin_host(load_entry_points=False)
    registry = ModelRegistry()
    with pytest.raises(UnknownArchitectureError, match=r"pip install loader-plugin-qwen$"):
        registry.resolve(["Qwen2ForCausalLM"], host=host)
    with pytest.raises(UnknownArchitectureError, match=r"^GGUF file m.gguf: architectures"):
        registry.resolve(["Qwen2ForCausalLM"], origin="GGUF file m.gguf:", host=host)
    with pytest.raises(UnknownArchitectureError,
                       match=r"loader-plugin-transformers \(builds any architecture transformers knows\)"):
        registry.resolve(["GPT2LMHeadModel"], host=host)


@pytest.mark.parametrize("bad", ["pkg.model.ToyForCausalLM", "pkg.model:", ":Toy", "pkg model:Toy",
                                 "pkg.model:Toy:Extra", 42])
def test_malformed_class_path_names_the_plugin(host, bad):
    host.register(Registers(ToyForCausalLM=bad), "sloppy")
    with pytest.raises(PluginError, match=r"plugin 'sloppy' registered architecture 'ToyForCausalLM'.*"
                                          r"expected a string 'package.module:ClassName'"):
        ModelRegistry.from_host(host)


def test_empty_architecture_name_names_the_plugin():
    with pytest.raises(PluginError, match="plugin 'sloppy' registered architecture ''; expected a non-empty"):
        ModelRegistry().register("", "pkg.model:Toy", plugin="sloppy")


def test_plugin_raising_in_the_hook_is_named(host):
    class Broken:
        @hookimpl
        def loader_register_architectures(self, register):
            raise RuntimeError("boom")

    host.register(Broken(), "broken")
    with pytest.raises(PluginError, match=r"plugin 'broken' failed in loader_register_architectures.*boom"):
        ModelRegistry.from_host(host)


def test_resolve_takes_the_first_registered_architecture(toy_module):
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{toy_module}:ToyForCausalLM", plugin="toy")
    registry.register("PlainModel", f"{toy_module}:PlainModel", plugin="toy")
    arch, cls = registry.resolve(["NotRegistered", "ToyForCausalLM", "PlainModel"])
    assert arch == "ToyForCausalLM"
    assert cls.__name__ == "ToyForCausalLM" and cls.__module__ == toy_module
    assert registry.load_class("ToyForCausalLM") is cls


def test_resolve_unknown_names_config_and_known_architectures():
    registry = ModelRegistry()
    registry.register("LlamaForCausalLM", "pkg.llama:Llama", plugin="llama")
    registry.register("Qwen2ForCausalLM", "pkg.qwen:Qwen2", plugin="qwen")
    with pytest.raises(UnknownArchitectureError) as err:
        registry.resolve(["GPT2LMHeadModel", "OtherModel"])
    message = str(err.value)
    assert "['GPT2LMHeadModel', 'OtherModel']" in message
    assert "known: LlamaForCausalLM, Qwen2ForCausalLM" in message


def test_resolve_with_no_architectures_or_no_plugins():
    with pytest.raises(UnknownArchitectureError, match="lists no architectures"):
        ModelRegistry().resolve([])
    with pytest.raises(UnknownArchitectureError, match=r"known: none \(is a model plugin installed\?\)"):
        ModelRegistry().resolve(["LlamaForCausalLM"])


def test_unknown_architecture_in_entry_and_model_info():
    registry = ModelRegistry()
    registry.register("LlamaForCausalLM", "pkg.llama:Llama", plugin="llama")
    with pytest.raises(UnknownArchitectureError, match=r"'Nope' is not registered.*known: LlamaForCausalLM"):
        registry.model_info("Nope")


@pytest.mark.parametrize(
    ("class_path", "expected"),
    [
        ("regtoy_missing_module_xyz.model:Toy", "No module named 'regtoy_missing_module_xyz'"),
        ("{toy}:DoesNotExist", "has no attribute 'DoesNotExist'"),
        ("{toy}:SupportsTensorParallel.supports_tensor_parallel", "is a bool, not a class"),
    ],
)
def test_resolve_import_failure_names_plugin_and_class_path(toy_module, class_path, expected):
    class_path = class_path.format(toy=toy_module)
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", class_path, plugin="toyplugin")
    with pytest.raises(PluginError) as err:
        registry.resolve(["ToyForCausalLM"])
    message = str(err.value)
    assert "plugin 'toyplugin'" in message and class_path in message and expected in message


def test_model_info_of_an_imported_class_needs_no_child(toy_module, monkeypatch):
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{toy_module}:ToyForCausalLM", plugin="toy")
    registry.load_class("ToyForCausalLM")

    def no_child(*args, **kwargs):
        raise AssertionError("no probe child expected for an imported class")

    monkeypatch.setattr(subprocess, "run", no_child)
    info = registry.model_info("ToyForCausalLM")
    assert info.supports_tensor_parallel and info.tied_embeddings_supported


def test_get_registry_is_cached_per_host():
    first = create_plugin_host(load_entry_points=False)
    first.register(Registers(ToyForCausalLM="toy_pkg.model:Toy"), "toy")
    second = create_plugin_host(load_entry_points=False)
    assert get_registry(first) is get_registry(first)
    assert get_registry(first) is not get_registry(second)
    assert get_registry(second).architectures() == []
    with use_plugin_host(first):
        assert get_registry() is get_registry(first)


# --- ModelInfo from the class -----------------------------------------------------------


class FullModel(SupportsTensorParallel, SupportsPipelineParallel, SupportsQuantization):
    is_text_generation_model = True
    tied_embeddings_supported = True
    packed_modules_mapping: ClassVar[dict[str, list[str]]] = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
    }


class OptOutModel(SupportsTensorParallel):
    supports_tensor_parallel = False


def test_model_info_from_mixins_and_class_attributes():
    info = inspect_model_class("FullForCausalLM", FullModel)
    assert info == ModelInfo(
        architecture="FullForCausalLM", is_text_generation_model=True, supports_tensor_parallel=True,
        supports_pipeline_parallel=True, supports_quantization=True, tied_embeddings_supported=True,
        packed_modules_mapping={"gate_up_proj": ["gate_proj", "up_proj"],
                                "qkv_proj": ["q_proj", "k_proj", "v_proj"]},
    )
    assert info.packed_modules() == FullModel.packed_modules_mapping
    hash(info)


def test_model_info_defaults_to_false_and_attributes_override_mixins():
    assert inspect_model_class("Plain", type("Plain", (), {})) == ModelInfo(architecture="Plain")
    assert inspect_model_class("OptOut", OptOutModel).supports_tensor_parallel is False


def test_model_info_never_instantiates():
    class Explodes(SupportsTensorParallel):
        def __init__(self):
            raise AssertionError("instantiated")

    assert inspect_model_class("Explodes", Explodes).supports_tensor_parallel


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"supports_tensor_parallel": "yes"},
         "Bad.supports_tensor_parallel: expected True or False, found 'yes'"),
        ({"packed_modules_mapping": ["qkv_proj"]}, "packed_modules_mapping: expected a dict"),
        ({"packed_modules_mapping": {"qkv_proj": "q_proj"}},
         "entry 'qkv_proj': expected a module name mapped"),
        ({"packed_modules_mapping": {"qkv_proj": [1, 2]}}, r"packed_modules_mapping\['qkv_proj'\]: expected"),
    ],
)
def test_malformed_capability_attributes_are_reported(attrs, expected):
    with pytest.raises(ModelInfoError, match=expected):
        inspect_model_class("Bad", type("Bad", (), attrs))


def test_model_info_json_round_trip():
    info = inspect_model_class("FullForCausalLM", FullModel)
    assert ModelInfo.from_json(info.to_json()) == info


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], "expected a JSON object"),
        ({"architecture": "A"}, "expected the keys"),
        ({**ModelInfo("A").to_json(), "supports_quantization": 1},
         "supports_quantization: expected true or false"),
        ({**ModelInfo("A").to_json(), "architecture": 3}, "architecture: expected a string"),
        ({**ModelInfo("A").to_json(), "packed_modules_mapping": []},
         "packed_modules_mapping: expected a JSON"),
    ],
)
def test_model_info_from_json_rejects_other_shapes(data, expected):
    with pytest.raises(ModelInfoError, match=expected):
        ModelInfo.from_json(data)
