"""The plugin appears in ``loader plugins``, registers the fallback, and imports light."""

from __future__ import annotations

import subprocess
import sys

from loader._plugins import create_plugin_host
from loader._registry import ModelRegistry


def test_listed_with_its_hook():
    record = create_plugin_host().records["transformers"]
    assert record.status == "loaded"
    assert record.distribution == "loader-plugin-transformers"
    assert "loader_register_architectures" in record.hooks


def test_registers_the_fallback():
    registry = ModelRegistry.from_host(create_plugin_host())
    assert registry.fallback is not None
    assert registry.fallback.architecture == "TransformersForCausalLM"
    assert registry.fallback.plugin == "transformers"


def test_entry_point_imports_neither_torch_nor_transformers():
    code = ("import sys, loader_plugin_transformers.plugin; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


_PROBE_TWICE = """
import subprocess, sys
from loader._plugins import create_plugin_host
from loader._registry import ModelRegistry
runs = []
real = subprocess.run
subprocess.run = lambda *a, **k: runs.append(a[0]) or real(*a, **k)
host = create_plugin_host()
first = ModelRegistry.from_host(host).model_info("TransformersForCausalLM")
again = ModelRegistry.from_host(host).model_info("TransformersForCausalLM")
print(len(runs), first == again, "GPT2LMHeadModel" in first.fallback_for)
"""


def test_what_the_fallback_covers_is_probed_once_then_cached(tmp_path):
    """In a fresh process (this one may have imported the class already, which skips the child)."""
    import os

    env = {**os.environ, "LOADER_CACHE_DIR": str(tmp_path)}
    env.pop("LOADER_PROBE_IN_PROCESS", None)
    out = subprocess.run([sys.executable, "-c", _PROBE_TWICE], capture_output=True, text=True, env=env,
                         check=True, timeout=300).stdout
    assert out.split() == ["1", "True", "True"]  # one child; the second answer came from disk
