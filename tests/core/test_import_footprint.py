"""What a process holds after plugin discovery: modules a load does not use stay out of it.

Each module imported is resident code for the life of the process (tens of KiB
each), and the transformers fallback must not peak above ``from_pretrained``
(issue 15; ``benchmarks/bench_fallback.py``). These modules are imported on
first use instead: the probe cache's folder lookup (``platformdirs``), and the
run:ai plugin's object store and snapshot code (its entry point needs only the
format names and the ``s3://`` test).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

NOT_AT_DISCOVERY = (
    "platformdirs",
    "loader_plugin_runai.detection",
    "loader_plugin_runai.object_store",
    "loader_plugin_runai.s3_folder",
    "loader_plugin_runai.identity",
    "loader_plugin_runai.tensor",
)

_DISCOVER = """
import json, sys
from loader._registry import get_registry
registry = get_registry()
registry.entries()
if registry.fallback is not None:
    registry.load_class(registry.fallback.architecture)
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


def test_plugin_discovery_and_the_fallback_class_leave_unused_modules_out() -> None:
    pytest.importorskip("loader_plugin_runai")
    loaded = _modules_after(_DISCOVER)
    assert "loader_plugin_runai.plugin" in loaded  # the plugin was discovered
    assert sorted(loaded & set(NOT_AT_DISCOVERY)) == []


def test_the_runai_package_still_exports_its_names_on_first_use() -> None:
    pytest.importorskip("loader_plugin_runai")
    code = ("import json, sys, loader_plugin_runai as p; before = 'loader_plugin_runai.s3_folder' in sys.modules; "
            "names = [n for n in p.__all__ if getattr(p, n, None) is None]; "
            "print(json.dumps([before, names, 'loader_plugin_runai.s3_folder' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, [], True]


def test_the_probe_cache_folder_is_looked_up_when_first_used(tmp_path, monkeypatch) -> None:
    from loader._registry import ModelRegistry, ProbeCache

    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path))
    registry = ModelRegistry()
    assert registry.cache.directory == tmp_path / "model-info"
    assert registry.cache is registry.cache
    given = ProbeCache(tmp_path / "given")
    assert ModelRegistry(cache=given).cache is given
