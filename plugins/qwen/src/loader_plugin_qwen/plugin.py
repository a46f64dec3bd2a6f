"""Entry point of loader-plugin-qwen: hook implementations only, imports kept light.

The model classes are registered as ``"module:Class"`` strings, so listing
plugins or architectures never imports torch or the model code.
"""

from __future__ import annotations

from loader.hookspecs import RegisterArchitecture, hookimpl

__all__ = ["loader_register_architectures"]


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register("Qwen2ForCausalLM", "loader_plugin_qwen.model:Qwen2ForCausalLM")
    register("Qwen3ForCausalLM", "loader_plugin_qwen.model:Qwen3ForCausalLM")
    register("Qwen2MoeForCausalLM", "loader_plugin_qwen.model:Qwen2MoeForCausalLM")
    register("Qwen3MoeForCausalLM", "loader_plugin_qwen.model:Qwen3MoeForCausalLM")
