"""The first-party plugins the core knows of, so an error can say which one to install.

When no installed plugin handles a format, a quantization method, a URI scheme
or an architecture, "no installed plugin provides it" leaves a new user to
guess; :func:`missing_plugin_hint` names the distribution that would
(``pip install loader-plugin-safetensors``), or says that it is installed but
disabled (``LOADER_DISABLE_PLUGINS``, or left out of ``LOADER_PLUGINS``) or
failed to import. The table is data, not a registry: nothing here is imported
or loaded, and a third-party plugin providing the same thing works unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import attrs

from ._plugins import ENTRY_POINT_GROUP

if TYPE_CHECKING:
    from ._plugins import PluginHost
    from .checkpoint import Source

__all__ = ["FALLBACK_ARCHITECTURE_PLUGIN", "KNOWN_PLUGINS", "KnownPlugin", "Provision", "formats_of_files",
           "installed_uri_schemes", "missing_plugin_hint", "provider_of"]

Provision = Literal["format", "quantization", "scheme", "architecture"]


@attrs.frozen
class KnownPlugin:
    """One first-party distribution and what it provides."""

    name: str  # the entry point name, as in LOADER_PLUGINS / LOADER_DISABLE_PLUGINS
    formats: tuple[str, ...] = ()
    quantization: tuple[str, ...] = ()
    schemes: tuple[str, ...] = ()  # URI schemes without "://"
    architectures: tuple[str, ...] = ()

    @property
    def distribution(self) -> str:
        return f"loader-plugin-{self.name}"

    def provides(self, kind: Provision, value: str) -> bool:
        values = {"format": self.formats, "quantization": self.quantization, "scheme": self.schemes,
                  "architecture": self.architectures}[kind]
        return value.lower() in {v.lower() for v in values}


# begin plugin list: written by `make plugins` from plugins/*/pyproject.toml
KNOWN_PLUGINS: tuple[KnownPlugin, ...] = (
    KnownPlugin("bnb", quantization=("bitsandbytes",)),
    KnownPlugin("gguf", formats=("gguf",)),
    KnownPlugin("llama", architectures=("LlamaForCausalLM",)),
    KnownPlugin("marlin", quantization=("gptq", "awq", "compressed-tensors")),
    KnownPlugin("mistral", architectures=("MistralForCausalLM", "MixtralForCausalLM")),
    KnownPlugin(
        "qwen",
        architectures=("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"),
    ),
    KnownPlugin("runai", formats=("runai_streamer", "runai_streamer_sharded"), schemes=("s3", "gs", "az")),
    KnownPlugin("safetensors", formats=("safetensors", "pt")),
    KnownPlugin("tensorizer", formats=("tensorizer",), schemes=("http", "https")),
    KnownPlugin("transformers"),
)
# end plugin list
"""Distribution ``loader-plugin-<name>`` → what it provides, from the ``[tool.loader]`` table of
``plugins/<name>/pyproject.toml`` (``make plugins`` writes it): keep that in step with the plugin's hooks."""

FALLBACK_ARCHITECTURE_PLUGIN = "transformers"
"""Builds any architecture ``transformers`` knows: the suggestion for one no model plugin names."""


def provider_of(kind: Provision, value: str) -> KnownPlugin | None:
    """The first-party plugin that provides ``value`` (for architectures, the ``transformers`` fallback)."""
    for plugin in KNOWN_PLUGINS:
        if plugin.provides(kind, value):
            return plugin
    if kind == "architecture":
        return next(p for p in KNOWN_PLUGINS if p.name == FALLBACK_ARCHITECTURE_PLUGIN)
    return None


def missing_plugin_hint(kind: Provision, value: str, host: PluginHost | None = None) -> str:
    """What to do about a missing provider: ``"; install it: pip install loader-plugin-x"`` or why it is off.

    Empty when no first-party plugin provides ``value``. The wording depends on
    the host's record of the plugin: absent (install it), ``blocked`` (which
    environment variable turned it off), ``failed`` (its import error) or
    ``loaded`` (installed and on, so the plugin declined this input).
    """
    plugin = provider_of(kind, value)
    if plugin is None:
        return ""
    record = None if host is None else host.records.get(plugin.name)
    what = plugin.distribution
    if kind == "architecture" and plugin.name == FALLBACK_ARCHITECTURE_PLUGIN:
        what = f"{plugin.distribution} (builds any architecture transformers knows)"
    if record is None:
        return f"; {what} provides it: pip install {plugin.distribution}"
    if record.status == "blocked":
        return f"; {plugin.distribution} provides it but is installed and disabled ({record.error})"
    if record.status == "failed":
        return f"; {plugin.distribution} provides it but failed to load ({record.error})"
    return ""


_SUFFIX_FORMATS = {".safetensors": "safetensors", ".bin": "pt", ".pt": "pt", ".pth": "pt", ".gguf": "gguf"}


def formats_of_files(source: Source) -> list[str]:
    """The formats a source's file names suggest (``.safetensors``, ``.bin``/``.pt``, ``.gguf``), in that order.

    Only names are looked at (the folder's top level, the file itself, or a remote reader's listing), so an
    error can say which plugin reads what is there even though no installed plugin recognised it.
    """
    import os

    names: list[str] = []
    try:
        if source.path is not None:
            names = os.listdir(source.path) if source.path.is_dir() else [source.path.name]
        elif source.reader is not None:
            names = list(source.reader.list_files())
    except OSError:
        return []
    found = {fmt for name in names for suffix, fmt in _SUFFIX_FORMATS.items() if name.endswith(suffix)}
    return [fmt for fmt in dict.fromkeys(_SUFFIX_FORMATS.values()) if fmt in found]


def installed_uri_schemes() -> list[str]:
    """URI schemes of the installed first-party plugins, from entry point names alone (nothing imported)."""
    import importlib.metadata

    installed = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return [scheme for plugin in KNOWN_PLUGINS if plugin.name in installed for scheme in plugin.schemes]
