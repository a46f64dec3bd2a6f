"""Entry point of loader-plugin-mistral: hook implementations only, imports kept light.

Registers ``MistralForCausalLM`` (lazily, as a ``"module:Class"`` string) and
reads Mistral's native ``params.json`` when a folder has no ``config.json``;
the core's ``config.json`` reader is ``trylast``, so this one is asked first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loader.hookspecs import RegisterArchitecture, hookimpl

if TYPE_CHECKING:
    from loader.checkpoint import Source, WeightFormat

__all__ = ["loader_read_config", "loader_register_architectures"]


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register("MistralForCausalLM", "loader_plugin_mistral.model:MistralForCausalLM")


def _is_consolidated(file: str) -> bool:
    """``consolidated.safetensors`` or a shard of it (``consolidated-00001-of-00002.safetensors``)."""
    base = file.replace("\\", "/").rsplit("/", 1)[-1]
    return base.startswith("consolidated") and base.endswith(".safetensors")


@hookimpl
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    folder = source.directory
    if folder is None or not any(_is_consolidated(f) for f in weight_format.files):
        return None
    from .native_config import read_native_config

    return read_native_config(folder)
