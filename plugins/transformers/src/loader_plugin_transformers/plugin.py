"""Entry point of loader-plugin-transformers: one registration, imports kept light.

The class is registered as a fallback (``fallback=True``): the registry hands it
every architecture no other plugin registers, and every load asked for with
``model_impl="transformers"``. Neither torch nor transformers is imported here;
``loader models`` learns which architectures it covers in the probe child.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loader.errors import UnknownArchitectureError
from loader.hookspecs import RegisterArchitecture, hookimpl

if TYPE_CHECKING:
    from loader.checkpoint import Source, WeightFormat

__all__ = ["FALLBACK_ARCHITECTURE", "loader_read_config", "loader_register_architectures"]

FALLBACK_ARCHITECTURE = "TransformersForCausalLM"
"""The fallback's registry name, as in vLLM."""


@hookimpl
def loader_register_architectures(register: RegisterArchitecture) -> None:
    register(FALLBACK_ARCHITECTURE, "loader_plugin_transformers.model:TransformersForCausalLM", fallback=True)


@hookimpl(wrapper=True)
def loader_read_config(source: Source, weight_format: WeightFormat
                       ) -> Generator[None, Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """A GGUF file of an architecture no native plugin loads: the config transformers would derive.

    Wraps the format plugins' answer: only when the GGUF plugin refuses the
    file's architecture (an :class:`~loader.errors.UnknownArchitectureError`)
    is the file's metadata read through transformers' GGUF tables
    (:mod:`.gguf_config`); the refusal stands, completed, when transformers
    cannot read that architecture either.
    """
    try:
        return (yield)
    except UnknownArchitectureError as refusal:
        if weight_format.name != "gguf" or not weight_format.files:
            raise
        from .gguf_config import config_from_gguf

        first, *rest = (Path(file) for file in weight_format.files)
        return config_from_gguf(first, refusal, other_parts=tuple(rest))
