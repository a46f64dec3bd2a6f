"""loader-plugin-gguf is installed, loads, and its entry point imports light."""

from __future__ import annotations

import subprocess
import sys

from loader._plugins import create_plugin_host


def test_plugin_is_loaded_with_its_hooks():
    record = create_plugin_host().records["gguf"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-gguf"
    assert record.hooks == (
        "loader_detect_format",
        "loader_detect_quantization",
        "loader_iter_weights",
        "loader_load_tokenizer",
        "loader_process_weights_after_loading",
        "loader_read_config",
    )


def test_entry_point_module_imports_no_heavy_package():
    code = (
        "import sys, loader_plugin_gguf.plugin; "
        "print(sorted(m for m in ('torch', 'gguf', 'numpy', 'tokenizers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_hooks_ignore_other_formats(tmp_path):
    import torch

    from loader._options import LoadOptions, parse_dtype
    from loader.checkpoint import Source, WeightFormat
    from loader.weights import ReadStats
    from loader_plugin_gguf import plugin

    source = Source(location=str(tmp_path), path=tmp_path)
    other = WeightFormat(name="safetensors", files=("x.safetensors",))
    options = LoadOptions(dtype=parse_dtype("float32"), device=torch.device("cpu"))
    assert plugin.loader_detect_format(source, "safetensors") is None
    assert plugin.loader_read_config(source, other) is None
    assert plugin.loader_load_tokenizer(source, other) is None
    assert plugin.loader_iter_weights(source, other, options, ReadStats()) is None
