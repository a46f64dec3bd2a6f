"""``loader --version`` and ``loader.__version__``: the core's version and every plugin's, from package metadata."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import types

import loader
from loader._cli.versions import version_lines
from loader._plugins import PluginRecord, create_plugin_host


def _run_version(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``loader --version`` with only ``env``'s plugin settings (none of the caller's own)."""
    base = {k: v for k, v in os.environ.items() if k not in ("LOADER_PLUGINS", "LOADER_DISABLE_PLUGINS")}
    return subprocess.run([sys.executable, "-m", "loader._cli.main", "--version"], capture_output=True, text=True,
                          env={**base, **env}, timeout=120)


def _installed_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    return {ep.name: ep for ep in importlib.metadata.entry_points(group="loader.plugins")}


def test_dunder_version_is_the_distributions_version() -> None:
    assert loader.__version__ == importlib.metadata.version("loader-core")


def test_version_prints_the_core_and_every_installed_plugin() -> None:
    installed = _installed_plugins()
    result = _run_version({})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"loader-core {importlib.metadata.version('loader-core')}"
    expected = sorted(f"{ep.dist.name} {ep.dist.version}" for ep in installed.values() if ep.dist is not None)
    assert sorted(lines[1:]) == expected


def test_version_says_which_plugins_are_disabled() -> None:
    installed = _installed_plugins()
    result = _run_version({"LOADER_DISABLE_PLUGINS": ",".join(installed)})
    assert result.returncode == 0, result.stderr
    for name, ep in installed.items():
        assert ep.dist is not None
        assert f"{ep.dist.name} {ep.dist.version}: disabled (LOADER_DISABLE_PLUGINS names {name!r})" in result.stdout


def test_version_with_an_unknown_allow_list_name_is_one_line_exit_2() -> None:
    result = _run_version({"LOADER_PLUGINS": "no-such-plugin"})
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: LOADER_PLUGINS names 'no-such-plugin', which no installed plugin")
    assert result.stderr.count("\n") == 1


def test_version_lines_name_failed_and_third_party_plugins() -> None:
    host = create_plugin_host(load_entry_points=False)
    host.register(types.ModuleType("acme_plugin"), "acme", distribution="acme-loader-tools", version="2.1")
    host.records["broken"] = PluginRecord("broken", "loader-plugin-broken", "0.3", "failed",
                                          error="ImportError: No module named 'missing_dependency'")
    host.records["qwen"] = PluginRecord("qwen", "loader-plugin-qwen", "0.1.0", "blocked",
                                        error="LOADER_PLUGINS does not name 'qwen'")
    assert version_lines(host, "0.1.0") == [
        "loader-core 0.1.0",
        "acme-loader-tools 2.1 (plugin 'acme')",
        "loader-plugin-broken 0.3: failed to import (ImportError: No module named 'missing_dependency')",
        "loader-plugin-qwen 0.1.0: disabled (LOADER_PLUGINS does not name 'qwen')",
    ]


def test_version_lines_without_installed_metadata() -> None:
    host = create_plugin_host(load_entry_points=False)
    host.register(types.ModuleType("in_process"), "local")
    assert version_lines(host, None) == ["loader-core unknown (not installed as a distribution)",
                                         "(no distribution) unknown (plugin 'local')"]
