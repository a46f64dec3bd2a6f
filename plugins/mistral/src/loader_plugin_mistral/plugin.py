"""Entry point of loader-plugin-mistral: hook implementations only, imports kept light.

Registers ``MistralForCausalLM`` (lazily, as a ``"module:Class"`` string),
recognises Mistral's native folders (``params.json`` + ``consolidated*.safetensors``,
no ``config.json``) as safetensors with a renaming step, and reads their
``params.json``; the core's ``config.json`` reader is ``trylast``, so this one
is asked first.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loader.hookspecs import RegisterArchitecture, hookimpl

from .consolidated import NATIVE_CONFIG, is_consolidated

if TYPE_CHECKING:
    from loader.checkpoint import Source, WeightFormat

__all__ = ["loader_detect_format", "loader_read_config", "loader_register_architectures"]


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register("MistralForCausalLM", "loader_plugin_mistral.model:MistralForCausalLM")
    register("MixtralForCausalLM", "loader_plugin_mistral.model:MixtralForCausalLM")


@hookimpl(tryfirst=True)
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    """A native folder: its consolidated safetensors files, renamed by the format (before any safetensors plugin)."""
    folder = source.directory
    if folder is None or not os.path.lexists(folder / NATIVE_CONFIG):  # a link is judged by native_weight_format
        return None  # not a native folder: answered before importing the renaming step
    from .native_layout import native_weight_format

    return native_weight_format(source, requested)


@hookimpl
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    folder = source.directory
    if folder is None or not any(is_consolidated(f) for f in weight_format.files):
        return None
    from .native_config import read_native_config

    return read_native_config(folder)
