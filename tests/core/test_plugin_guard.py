"""The guarded view the host registers with pluggy in place of each plugin."""

from __future__ import annotations

from pathlib import Path

import pluggy
import pytest

import loader
from loader import _hooks as hooks
from loader._plugin_guard import GuardedPlugin, GuardedStream, calling_plugin
from loader._plugins import create_plugin_host
from loader.checkpoint import Source, WeightFormat


def _host():  # type: ignore[no-untyped-def]
    return create_plugin_host(load_entry_points=False)


class Detects:
    """A format plugin with a plain implementation and a wrapper, recording who was running."""

    def __init__(self) -> None:
        self.running: list[str | None] = []

    @loader.hookimpl
    def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
        self.running.append(calling_plugin())
        return WeightFormat("fake", ())

    @loader.hookimpl(wrapper=True)
    def loader_read_config(self):  # type: ignore[no-untyped-def]
        self.running.append(calling_plugin())
        return (yield)


def test_pluggy_holds_a_view_of_the_plugin_with_the_same_hooks_and_options() -> None:
    host = _host()
    plugin = Detects()
    host.register(plugin, "detects")
    view = host.pm.get_plugin("detects")
    assert isinstance(view, GuardedPlugin) and view.plugin is plugin
    assert host.records["detects"].hooks == ("loader_detect_format", "loader_read_config")
    [wrapper] = [impl for impl in host.pm.hook.loader_read_config.get_hookimpls() if impl.plugin_name == "detects"]
    assert wrapper.wrapper and not wrapper.hookwrapper
    [impl] = [impl for impl in host.pm.hook.loader_detect_format.get_hookimpls() if impl.plugin_name == "detects"]
    assert impl.argnames == ("source",), "pluggy reads the plugin's own signature, not the guard's *args"


def test_calling_plugin_names_the_running_implementation(tmp_path: Path) -> None:
    host = _host()
    plugin = Detects()
    host.register(plugin, "detects")
    source = Source("x", tmp_path)
    (tmp_path / "config.json").write_text('{"architectures": ["X"]}')
    hooks.detect_format(source, "auto", host)
    hooks.read_config(source, WeightFormat("fake", ()), host)
    assert plugin.running == ["detects", "detects"]
    assert calling_plugin() is None


def test_the_same_plugin_under_two_names_is_refused() -> None:
    host = _host()
    plugin = Detects()
    host.register(plugin, "one")
    with pytest.raises(ValueError, match="already registered"):
        host.register(plugin, "two")
    with pytest.raises(ValueError, match="Plugin name already registered"):
        host.register(Detects(), "one")


def test_a_wrapper_that_is_not_a_generator_is_refused_as_pluggy_refuses_it() -> None:
    class NotAGenerator:
        @loader.hookimpl(wrapper=True)
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            return None

    host = _host()
    with pytest.raises(pluggy.PluginValidationError, match="not a generator function"):
        host.register(NotAGenerator(), "not-a-generator")
    assert "not-a-generator" not in host.records


def test_a_wrapper_that_does_not_yield_is_named(tmp_path: Path) -> None:
    class NeverYields:
        @loader.hookimpl(hookwrapper=True)
        def loader_detect_format(self):  # type: ignore[no-untyped-def]
            if False:
                yield

    host = _host()
    host.register(NeverYields(), "never")
    with pytest.raises(loader.PluginError, match="^plugin 'never' failed in loader_detect_format: RuntimeError: "
                                                 "the hookwrapper did not yield$"):
        hooks.detect_format(Source("x", tmp_path), "auto", host)


def test_closing_a_guarded_stream_closes_the_plugins_generator() -> None:
    closed = []

    def weights():  # type: ignore[no-untyped-def]
        try:
            yield "a", None
            yield "b", None
        finally:
            closed.append(True)

    stream = GuardedStream(weights(), "stream", "loader_iter_weights")
    assert next(stream)[0] == "a"
    stream.close()
    assert closed == [True]
    assert list(stream) == []
