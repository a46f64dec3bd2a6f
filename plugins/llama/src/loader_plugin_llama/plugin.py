"""Entry point of loader-plugin-llama: hook implementations only, imports kept light.

The model class is registered as a ``"module:Class"`` string, so listing
plugins or architectures never imports torch or the model code.
"""

from __future__ import annotations

from loader.hookspecs import RegisterArchitecture, hookimpl

__all__ = ["loader_register_architectures"]


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register("LlamaForCausalLM", "loader_plugin_llama.model:LlamaForCausalLM")
