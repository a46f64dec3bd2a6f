"""Typed calls into the plugins, one function per hook.

The rest of loader calls these, never ``pm.hook``. Each call goes through
pluggy's own ``HookCaller``, so implementations run in pluggy's order
(``tryfirst``/``trylast``, LIFO otherwise), receive only the arguments they
accept, and ``wrapper=True``/``hookwrapper=True`` implementations wrap the
others as pluggy documents. The host registered every plugin guarded
(:mod:`loader._plugin_guard`), so an exception that is not a
:class:`~loader.errors.LoadError` arrives here as a
:class:`~loader.errors.PluginError` naming the plugin and the hook, and so do
errors while iterating a plugin's weight stream.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import pluggy

from ._plugin_guard import calling_plugin, recording_answers
from ._plugins import current_plugin_host
from .errors import ConfigError, LoadError, PluginError, SourceNotFoundError, UnsupportedError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ._known_plugins import Provision
    from ._options import LoadOptions
    from ._plugins import PluginHost
    from .checkpoint import Source, TokenizerBundle, WeightFormat
    from .hookspecs import CliCommand, RegisterArchitecture
    from .layers.quantization import QuantizationConfig
    from .weights import ReadStats, WeightStream

__all__ = [
    "Answer",
    "cli_commands",
    "detect_format",
    "detect_quantization",
    "iter_weights",
    "load_tokenizer",
    "process_weights_after_loading",
    "read_config",
    "register_architectures",
    "resolve_source",
]


log = logging.getLogger(__name__)


def _host(host: PluginHost | None) -> PluginHost:
    """``host`` if given, else the load session's (the process-wide one outside a load)."""
    if host is not None:
        return host
    return current_plugin_host()


@attrs.frozen
class Answer:
    """A ``firstresult`` hook's answer and the plugin that gave it (a wrapper, if it replaced the answer)."""

    plugin: str | None  # None only for an implementation registered past the host's guard
    value: Any


def _first(caller: pluggy.HookCaller, **kwargs: Any) -> Answer | None:
    """Call a ``firstresult`` hook through pluggy; ``None`` if every implementation declined.

    The answering plugin is the first whose noted answer is the very object
    pluggy returned: a wrapper that passes the answer through leaves it to the
    inner implementation, one that replaces it answers itself.
    """
    with recording_answers() as answers:
        value = caller(**kwargs)
    if value is None:
        return None
    plugin = next((name for name, answer in answers if answer is value), None)
    log.info("%s answered by plugin %r", caller.name, plugin)
    return Answer(plugin, value)


def missing_plugin_hint(kind: Provision, name: str, host: PluginHost) -> str:
    """:func:`loader._known_plugins.missing_plugin_hint`, imported when a message needs it: only a failed
    lookup reads the table of known plugins, so a load that succeeds does not hold it."""
    from . import _known_plugins

    return _known_plugins.missing_plugin_hint(kind, name, host)


def resolve_source(location: str, options: LoadOptions, host: PluginHost | None = None) -> Source:
    """Resolve a location; raises :class:`~loader.errors.SourceNotFoundError` if nobody can."""
    found = _first(_host(host).pm.hook.loader_resolve_source, location=location, options=options)
    if found is None:
        scheme, sep, _ = location.partition("://")
        if sep and scheme:
            raise SourceNotFoundError(
                f"{location}: no installed plugin opens {scheme}:// URIs"
                f"{missing_plugin_hint('scheme', scheme, _host(host))}"
            )
        raise SourceNotFoundError(f"{location}: not a local path, Hub id or URI any plugin can open")
    return found.value  # type: ignore[no-any-return]


def detect_format(source: Source, requested: str, host: PluginHost | None = None) -> WeightFormat:
    """Choose the weight format; raises if no plugin recognises the files."""
    plugins = _host(host)
    found = _first(plugins.pm.hook.loader_detect_format, source=source, requested=requested)
    if found is None:
        if requested != "auto":
            raise UnsupportedError(
                f"{source.display()}: load_format {requested!r} is not provided by any installed plugin "
                f"or the source holds no files of that format{missing_plugin_hint('format', requested, plugins)}"
            )
        from ._known_plugins import formats_of_files

        present = formats_of_files(source)
        hints = "".join(missing_plugin_hint("format", name, plugins) for name in present)
        what = f" ({', '.join(present)} files)" if present else ""
        raise SourceNotFoundError(
            f"{source.display()}: no weight files any installed format plugin recognises{what}{hints}"
        )
    return found.value  # type: ignore[no-any-return]


def read_config(source: Source, weight_format: WeightFormat, host: PluginHost | None = None) -> Mapping[str, Any]:
    """The model configuration; raises :class:`~loader.errors.ConfigError` if there is none."""
    found = _first(_host(host).pm.hook.loader_read_config, source=source, weight_format=weight_format)
    if found is None:
        raise ConfigError(f"{source.display()}: no config.json and no plugin could derive a configuration")
    return found.value  # type: ignore[no-any-return]


def load_tokenizer(source: Source, weight_format: WeightFormat, host: PluginHost | None = None) -> TokenizerBundle:
    """The checkpoint's tokenizer; raises :class:`~loader.errors.LoadError` if there is none."""
    found = _first(_host(host).pm.hook.loader_load_tokenizer, source=source, weight_format=weight_format)
    if found is None:
        raise LoadError(f"{source.display()}: no tokenizer.json and no plugin could build a tokenizer")
    return found.value  # type: ignore[no-any-return]


def iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats,
    host: PluginHost | None = None, model: nn.Module | None = None,
) -> WeightStream:
    """The owning plugin's lazy iterator; errors while iterating name the plugin (its stream is guarded)."""
    found = _first(_host(host).pm.hook.loader_iter_weights, source=source,
                   weight_format=weight_format, options=options, stats=stats, model=model)
    if found is None:
        raise UnsupportedError(
            f"no installed plugin can read weights of format {weight_format.name!r}"
            f"{missing_plugin_hint('format', weight_format.name, _host(host))}"
        )
    return found.value  # type: ignore[no-any-return]


def register_architectures(register: Callable[[str], RegisterArchitecture], host: PluginHost | None = None) -> None:
    """Ask every plugin to register; ``register(plugin_name)`` returns that plugin's callback.

    pluggy hands every implementation the same ``register``; it forwards to the
    callback of the plugin whose implementation is running, so a registration
    is always credited to the plugin that made it.
    """

    def register_for_caller(architecture: str, class_path: str, *, fallback: bool = False) -> None:
        plugin = calling_plugin()
        if plugin is None:
            raise PluginError(
                f"register({architecture!r}, {class_path!r}) was called after loader_register_architectures "
                "returned; call it while the hook runs"
            )
        # ``fallback`` only when set, so a callback written before fallbacks existed keeps working
        register(plugin)(architecture, class_path, **({"fallback": True} if fallback else {}))

    _host(host).pm.hook.loader_register_architectures(register=register_for_caller)


def cli_commands(host: PluginHost | None = None) -> list[CliCommand]:
    """Every plugin's command-line subcommands, in plugin order."""
    found: list[CliCommand] = []
    for commands in _host(host).pm.hook.loader_cli_commands():
        found.extend(commands or ())
    return found


def detect_quantization(
    hf_config: Mapping[str, Any], requested: str | None, options: LoadOptions,
    host: PluginHost | None = None,
) -> QuantizationConfig | None:
    """The quantization config, ``None`` for a plain load; raises if a request has no plugin."""
    found = _first(_host(host).pm.hook.loader_detect_quantization, hf_config=hf_config,
                   requested=requested, options=options)
    if found is not None:
        return found.value  # type: ignore[no-any-return]
    if requested is not None:
        raise UnsupportedError(
            f"quantization {requested!r} is not provided by any installed plugin"
            f"{missing_plugin_hint('quantization', requested, _host(host))}"
        )
    declared = hf_config.get("quantization_config")
    if isinstance(declared, Mapping) and declared.get("quant_method"):
        method = str(declared["quant_method"])
        raise UnsupportedError(
            f"config.json declares quantization_config.quant_method={method!r}, "
            f"which no installed plugin provides{missing_plugin_hint('quantization', method, _host(host))}"
        )
    return None


def process_weights_after_loading(
    model: nn.Module, quant_config: QuantizationConfig | None, target_device: torch.device,
    host: PluginHost | None = None,
) -> None:
    """Run every plugin's post-processing."""
    _host(host).pm.hook.loader_process_weights_after_loading(
        model=model, quant_config=quant_config, target_device=target_device
    )
