"""The plugin is installed, loads, implements its hooks, and its entry module imports light."""

from __future__ import annotations

import subprocess
import sys

from loader._plugins import create_plugin_host


def test_plugin_table_lists_safetensors_with_its_hooks():
    host = create_plugin_host()
    record = host.records["safetensors"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-safetensors"
    assert set(record.hooks) == {"loader_detect_format", "loader_iter_weights"}


def test_entry_module_does_not_import_torch_numpy_or_safetensors():
    code = (
        "import sys, loader.hookspecs, loader.checkpoint, loader.weights\n"
        "before = {m for m in ('torch', 'numpy', 'safetensors') if m in sys.modules}\n"
        "import loader_plugin_safetensors.plugin\n"
        "after = {m for m in ('torch', 'numpy', 'safetensors') if m in sys.modules}\n"
        "print(sorted(after - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
