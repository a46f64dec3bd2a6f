"""The plugin is installed, loads, implements its hooks, and its entry module imports light."""

from __future__ import annotations

import subprocess
import sys

from loader.testing import create_plugin_host


def test_plugin_table_lists_runai_with_its_hooks() -> None:
    host = create_plugin_host()
    record = host.records["runai"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-runai"
    assert set(record.hooks) == {"loader_resolve_source", "loader_detect_format", "loader_iter_weights"}


def test_entry_module_does_not_import_torch_boto3_or_the_streamer() -> None:
    heavy = ("torch", "boto3", "botocore", "runai_model_streamer")
    code = (
        "import sys, loader.hookspecs, loader.checkpoint, loader.weights, loader.models\n"
        f"heavy = {heavy!r}\n"
        "before = {m for m in heavy if m in sys.modules}\n"
        "import loader_plugin_runai.plugin\n"
        "after = {m for m in heavy if m in sys.modules}\n"
        "print(sorted(after - before))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
