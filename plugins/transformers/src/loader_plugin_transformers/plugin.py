"""Entry point of loader-plugin-transformers: one registration, imports kept light.

The class is registered as a fallback (``fallback=True``): the registry hands it
every architecture no other plugin registers, and every load asked for with
``model_impl="transformers"``. Neither torch nor transformers is imported here;
``loader models`` learns which architectures it covers in the probe child.
"""

from __future__ import annotations

from loader.hookspecs import RegisterArchitecture, hookimpl

__all__ = ["FALLBACK_ARCHITECTURE", "loader_register_architectures"]

FALLBACK_ARCHITECTURE = "TransformersForCausalLM"
"""The fallback's registry name, as in vLLM."""


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register(FALLBACK_ARCHITECTURE, "loader_plugin_transformers.model:TransformersForCausalLM", fallback=True)
