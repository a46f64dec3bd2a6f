"""The wheel envs' guard: it names a plugin package that would be imported from outside site-packages."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from tests.helpers.installed_packages import import_locations, not_from_wheels


def test_a_plugin_on_sys_path_outside_site_packages_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "loader_plugin_guardprobe"
    package.mkdir()
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    probe = importlib.metadata.EntryPoint("guardprobe", "loader_plugin_guardprobe.plugin", "loader.plugins")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda group: [*real(group=group), probe] if group == "loader.plugins" else real(group=group))
    assert import_locations()["loader_plugin_guardprobe"] == package.resolve()
    assert f"loader_plugin_guardprobe from {package.resolve()}" in not_from_wheels()

