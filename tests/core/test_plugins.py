"""Boot of the plugin manager: core plugins, entry points, allow/deny lists, broken plugins."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest

import loader
from loader import _plugins as plugins
from loader._plugins import create_plugin_host
from loader._session import current_session


class _FakeDist:
    def __init__(self, name: str) -> None:
        self.name = name
        self.version = "9.9"


class _FakeEntryPoint:
    def __init__(self, name: str, target: object | Exception) -> None:
        self.name = name
        self.dist = _FakeDist(f"loader-plugin-{name}")
        self._target = target

    def load(self) -> object:
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def _good_plugin() -> types.ModuleType:
    module = types.ModuleType("fake_good")

    @loader.hookimpl
    def loader_register_architectures(register):  # type: ignore[no-untyped-def]
        register("GoodForCausalLM", "fake_good:Model")

    module.loader_register_architectures = loader_register_architectures  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_entry_points(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    eps = [
        _FakeEntryPoint("good", _good_plugin()),
        _FakeEntryPoint("broken", ImportError("No module named 'missing_dependency'")),
        _FakeEntryPoint("other", types.ModuleType("fake_other")),
    ]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: eps if group == "loader.plugins" else [])
    return eps


def test_core_plugins_are_always_registered() -> None:
    host = create_plugin_host(load_entry_points=False)
    names = {r.name for r in host.plugin_records()}
    assert {"core.sources", "core.hf_files", "core.postprocess"} <= names
    assert "loader_resolve_source" in host.records["core.sources"].hooks


def test_broken_plugin_is_recorded_and_others_load(fake_entry_points) -> None:  # type: ignore[no-untyped-def]
    host = create_plugin_host(environ={})
    assert host.records["good"].status == "loaded"
    assert host.records["good"].hooks == ("loader_register_architectures",)
    assert host.records["good"].distribution == "loader-plugin-good"
    assert host.records["good"].version == "9.9"
    broken = host.records["broken"]
    assert broken.status == "failed"
    assert broken.error == "ImportError: No module named 'missing_dependency'"
    assert host.records["other"].status == "loaded"


def test_allow_list_blocks_the_rest(fake_entry_points) -> None:  # type: ignore[no-untyped-def]
    host = create_plugin_host(environ={"LOADER_PLUGINS": "good, other"})
    assert host.records["good"].status == "loaded"
    assert host.records["broken"].status == "blocked"
    assert host.pm.get_plugin("broken") is None


def test_deny_list_blocks_named(fake_entry_points) -> None:  # type: ignore[no-untyped-def]
    host = create_plugin_host(environ={"LOADER_DISABLE_PLUGINS": "good"})
    assert host.records["good"].status == "blocked"
    assert host.pm.get_plugin("good") is None
    assert host.records["other"].status == "loaded"


def test_misspelled_hook_is_an_error() -> None:
    class Typo:
        @loader.hookimpl
        def loader_detect_formats(self, source):  # type: ignore[no-untyped-def]
            return None

    host = create_plugin_host(load_entry_points=False)
    host.register(Typo(), "typo")
    with pytest.raises(Exception, match="loader_detect_formats"):
        host.pm.check_pending()


def test_use_plugin_host_swaps_and_restores() -> None:
    first = create_plugin_host(load_entry_points=False)
    second = create_plugin_host(load_entry_points=False)
    with plugins.use_plugin_host(first):
        assert plugins.current_plugin_host() is first
        with plugins.use_plugin_host(second):
            assert plugins.current_plugin_host() is second
        assert plugins.current_plugin_host() is first
    assert current_session().host is None


def test_use_plugin_host_is_this_threads_only() -> None:
    """The session's host is not process-wide: another thread keeps the default host."""
    import threading

    first = create_plugin_host(load_entry_points=False)
    seen: list[object] = []
    with plugins.use_plugin_host(first):
        thread = threading.Thread(target=lambda: seen.append(current_session().host))
        thread.start()
        thread.join()
    assert seen == [None]


def test_importing_loader_does_not_import_torch() -> None:
    import subprocess

    code = "import loader, loader._plugins, sys; loader._plugins.create_plugin_host(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
