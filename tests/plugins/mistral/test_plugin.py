"""loader-plugin-mistral is installed, loads, registers its architecture lazily and reads params.json."""

from __future__ import annotations

import subprocess
import sys

from loader._plugins import create_plugin_host


def test_plugin_is_loaded_with_its_hooks():
    record = create_plugin_host().records["mistral"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-mistral"
    assert record.hooks == ("loader_detect_format", "loader_read_config", "loader_register_architectures")


def test_registers_mistral_and_mixtral_as_lazy_class_paths():
    from loader_plugin_mistral import plugin

    registered: list[tuple[str, str]] = []
    plugin.loader_register_architectures(lambda arch, target: registered.append((arch, target)))
    assert registered == [("MistralForCausalLM", "loader_plugin_mistral.model:MistralForCausalLM"),
                          ("MixtralForCausalLM", "loader_plugin_mistral.model:MixtralForCausalLM")]


def test_entry_point_module_does_not_import_torch():
    code = "import sys, loader_plugin_mistral.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_class_declares_what_the_registry_reads():
    from loader._interfaces import SupportsQuantization, SupportsTensorParallel
    from loader_plugin_mistral.model import MistralForCausalLM

    assert MistralForCausalLM.is_text_generation_model is True
    assert MistralForCausalLM.tied_embeddings_supported is True
    assert issubclass(MistralForCausalLM, SupportsTensorParallel)
    assert issubclass(MistralForCausalLM, SupportsQuantization)
    assert MistralForCausalLM.packed_modules_mapping == {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }
