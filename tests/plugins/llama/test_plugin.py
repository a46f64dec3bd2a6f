"""loader-plugin-llama is installed, loads, and registers its architecture lazily."""

from __future__ import annotations

import subprocess
import sys

from loader._plugins import create_plugin_host


def test_plugin_is_loaded_with_its_hooks():
    record = create_plugin_host().records["llama"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-llama"
    assert record.hooks == ("loader_register_architectures",)


def test_registers_llama_as_a_lazy_class_path():
    from loader_plugin_llama import plugin

    registered: list[tuple[str, str]] = []
    plugin.loader_register_architectures(lambda arch, target: registered.append((arch, target)))
    assert registered == [("LlamaForCausalLM", "loader_plugin_llama.model:LlamaForCausalLM")]


def test_entry_point_module_does_not_import_torch():
    code = "import sys, loader_plugin_llama.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_class_declares_what_the_registry_reads():
    from loader._interfaces import SupportsQuantization, SupportsTensorParallel
    from loader_plugin_llama.model import LlamaForCausalLM

    assert LlamaForCausalLM.is_text_generation_model is True
    assert LlamaForCausalLM.tied_embeddings_supported is True
    assert issubclass(LlamaForCausalLM, SupportsTensorParallel)
    assert issubclass(LlamaForCausalLM, SupportsQuantization)
    assert LlamaForCausalLM.packed_modules_mapping == {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
