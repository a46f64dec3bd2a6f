"""Entry point: registers the architecture by a ``"module:Class"`` string, so nothing heavy is imported."""

from __future__ import annotations

from loader.hookspecs import RegisterArchitecture, hookimpl

__all__ = ["loader_register_architectures"]


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register("ScaledEmbeddingLlamaForCausalLM", "loader_plugin_scaled_llama.model:ScaledEmbeddingLlamaForCausalLM")
