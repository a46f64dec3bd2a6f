"""Typed calls into the plugins, one function per hook.

The rest of loader calls these, never ``pm.hook``. Each call runs the
implementations in pluggy's order, passes each only the arguments it accepts,
and turns an exception that is not a :class:`~loader.errors.LoadError` into a
:class:`~loader.errors.PluginError` naming the plugin and the hook.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from .errors import LoadError, PluginError

if TYPE_CHECKING:
    import torch
    from torch import nn

    from .checkpoint import Source, TokenizerBundle, WeightFormat
    from .hookspecs import RegisterArchitecture
    from .layers.quantization import QuantizationConfig, QuantizeMethodBase
    from .options import LoadOptions
    from .plugins import PluginHost
    from .weights import ReadStats, WeightStream

__all__ = [
    "detect_format",
    "detect_quantization",
    "get_quant_method",
    "iter_weights",
    "load_tokenizer",
    "process_weights_after_loading",
    "read_config",
    "register_architectures",
    "resolve_source",
]


def _host(host: PluginHost | None) -> PluginHost:
    """``host`` if given, else the load session's (the process-wide one outside a load)."""
    if host is not None:
        return host
    from .session import current_session

    return current_session().plugin_host()


def _plugin_failed(plugin: str, hook: str, exc: BaseException) -> PluginError:
    return PluginError(f"plugin {plugin!r} failed in {hook}: {type(exc).__name__}: {exc}")


def _invoke(plugin: str, hook: str, impl: Any, kwargs: dict[str, Any]) -> Any:
    """Run one implementation with the arguments it accepts; its bugs become a PluginError naming it."""
    try:
        return impl.function(**{name: kwargs[name] for name in impl.argnames})
    except LoadError:
        raise
    except Exception as exc:
        raise _plugin_failed(plugin, hook, exc) from exc


def _call(host: PluginHost | None, hook: str, *, firstresult: bool, **kwargs: Any) -> Any:
    results = []
    for plugin, impl in _host(host).implementers(hook):
        result = _invoke(plugin, hook, impl, kwargs)
        if result is None:
            continue
        if firstresult:
            return plugin, result
        results.append((plugin, result))
    return None if firstresult else results


def resolve_source(location: str, options: LoadOptions, host: PluginHost | None = None) -> Source:
    """Resolve a location; raises :class:`~loader.errors.SourceNotFoundError` if nobody can."""
    from .errors import SourceNotFoundError

    found = _call(host, "loader_resolve_source", firstresult=True, location=location, options=options)
    if found is None:
        raise SourceNotFoundError(f"{location}: not a local path, Hub id or URI any plugin can open")
    return found[1]  # type: ignore[no-any-return]


def detect_format(source: Source, requested: str, host: PluginHost | None = None) -> WeightFormat:
    """Choose the weight format; raises if no plugin recognises the files."""
    from .errors import SourceNotFoundError, UnsupportedError

    found = _call(host, "loader_detect_format", firstresult=True, source=source, requested=requested)
    if found is None:
        if requested != "auto":
            raise UnsupportedError(
                f"{source.display()}: load_format {requested!r} is not provided by any installed plugin "
                "or the source holds no files of that format"
            )
        raise SourceNotFoundError(
            f"{source.display()}: no weight files any installed format plugin recognises"
        )
    return found[1]  # type: ignore[no-any-return]


def read_config(source: Source, weight_format: WeightFormat, host: PluginHost | None = None) -> Mapping[str, Any]:
    """The model configuration; raises :class:`~loader.errors.ConfigError` if there is none."""
    from .errors import ConfigError

    found = _call(host, "loader_read_config", firstresult=True, source=source, weight_format=weight_format)
    if found is None:
        raise ConfigError(f"{source.display()}: no config.json and no plugin could derive a configuration")
    return found[1]  # type: ignore[no-any-return]


def load_tokenizer(source: Source, weight_format: WeightFormat, host: PluginHost | None = None) -> TokenizerBundle:
    """The checkpoint's tokenizer; raises :class:`~loader.errors.LoadError` if there is none."""
    found = _call(host, "loader_load_tokenizer", firstresult=True, source=source, weight_format=weight_format)
    if found is None:
        raise LoadError(f"{source.display()}: no tokenizer.json and no plugin could build a tokenizer")
    return found[1]  # type: ignore[no-any-return]


def iter_weights(
    source: Source, weight_format: WeightFormat, options: LoadOptions, stats: ReadStats,
    host: PluginHost | None = None, model: nn.Module | None = None,
) -> WeightStream:
    """The owning plugin's lazy iterator; errors while iterating name the plugin."""
    from .errors import UnsupportedError

    found = _call(host, "loader_iter_weights", firstresult=True, source=source,
                  weight_format=weight_format, options=options, stats=stats, model=model)
    if found is None:
        raise UnsupportedError(f"no installed plugin can read weights of format {weight_format.name!r}")
    plugin, stream = found
    return _guard_stream(plugin, stream)


def _guard_stream(plugin: str, stream: WeightStream) -> Iterator[Any]:
    try:
        yield from stream
    except LoadError:
        raise
    except Exception as exc:
        raise _plugin_failed(plugin, "loader_iter_weights", exc) from exc


def register_architectures(register: Any, host: PluginHost | None = None) -> None:
    """Ask every plugin to register; ``register(plugin_name)`` returns that plugin's callback."""
    for plugin, impl in _host(host).implementers("loader_register_architectures"):
        callback: RegisterArchitecture = register(plugin)
        _invoke(plugin, "loader_register_architectures", impl, {"register": callback})


def detect_quantization(
    hf_config: Mapping[str, Any], requested: str | None, options: LoadOptions,
    host: PluginHost | None = None,
) -> QuantizationConfig | None:
    """The quantization config, ``None`` for a plain load; raises if a request has no plugin."""
    from .errors import UnsupportedError

    found = _call(host, "loader_detect_quantization", firstresult=True, hf_config=hf_config,
                  requested=requested, options=options)
    if found is not None:
        return found[1]  # type: ignore[no-any-return]
    if requested is not None:
        raise UnsupportedError(f"quantization {requested!r} is not provided by any installed plugin")
    declared = hf_config.get("quantization_config")
    if isinstance(declared, Mapping) and declared.get("quant_method"):
        raise UnsupportedError(
            f"config.json declares quantization_config.quant_method={declared['quant_method']!r}, "
            "which no installed plugin provides"
        )
    return None


def get_quant_method(
    quant_config: QuantizationConfig, layer: nn.Module, prefix: str, host: PluginHost | None = None
) -> QuantizeMethodBase | None:
    """The layer's quantize method, or ``None`` to keep it unquantized."""
    found = _call(host, "loader_get_quant_method", firstresult=True, quant_config=quant_config,
                  layer=layer, prefix=prefix)
    return None if found is None else found[1]


def process_weights_after_loading(
    model: nn.Module, quant_config: QuantizationConfig | None, target_device: torch.device,
    host: PluginHost | None = None,
) -> None:
    """Run every plugin's post-processing."""
    _call(host, "loader_process_weights_after_loading", firstresult=False, model=model,
          quant_config=quant_config, target_device=target_device)
