"""loader-plugin-qwen is installed, loads, and registers Qwen2 and Qwen3 lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loader._plugins import create_plugin_host


def test_plugin_is_loaded_with_its_hooks():
    record = create_plugin_host().records["qwen"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-qwen"
    assert record.hooks == ("loader_register_architectures",)


def test_registers_both_generations_and_their_moe_models_as_lazy_class_paths():
    from loader_plugin_qwen import plugin

    registered: list[tuple[str, str]] = []
    plugin.loader_register_architectures(lambda arch, target: registered.append((arch, target)))
    assert registered == [
        ("Qwen2ForCausalLM", "loader_plugin_qwen.model:Qwen2ForCausalLM"),
        ("Qwen3ForCausalLM", "loader_plugin_qwen.model:Qwen3ForCausalLM"),
        ("Qwen2MoeForCausalLM", "loader_plugin_qwen.model:Qwen2MoeForCausalLM"),
        ("Qwen3MoeForCausalLM", "loader_plugin_qwen.model:Qwen3MoeForCausalLM"),
    ]


def test_entry_point_module_does_not_import_torch():
    code = "import sys, loader_plugin_qwen.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["Qwen2ForCausalLM", "Qwen3ForCausalLM"])
def test_classes_declare_what_the_registry_reads(name):
    from loader._interfaces import SupportsQuantization, SupportsTensorParallel
    from loader_plugin_qwen import model

    cls = getattr(model, name)
    assert cls.is_text_generation_model is True
    assert cls.tied_embeddings_supported is True
    assert issubclass(cls, SupportsTensorParallel)
    assert issubclass(cls, SupportsQuantization)
    assert cls.packed_modules_mapping["qkv_proj"] == ["q_proj", "k_proj", "v_proj"]
