"""What a process holds after plugin discovery: modules a load does not use stay out of it.

Each module imported is resident code for the life of the process (tens of KiB
each), and the transformers fallback must not peak above ``from_pretrained``
(issue 15; ``benchmarks/bench_fallback.py``). These modules are imported on
first use instead: the probe cache's folder lookup (``platformdirs``), and the
run:ai plugin's object store and snapshot code (its entry point needs only the
format names and the ``s3://`` test).

A whole local safetensors load (native class and fallback) leaves out more: what
a class can do (probe, its disk cache, fingerprints), the table of known plugins
(read only for a message about a missing one), a remote source's index rule, the
Hub reader, and the quantization and layout code of plugins the checkpoint does
not use (each entry point tests the config or the folder before importing them).
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
    "loader_plugin_runai.object_folder",
    "loader_plugin_runai.stores",
    "loader_plugin_runai.gcs_store",
    "loader_plugin_runai.azure_store",
    "loader_plugin_runai.identity",
    "loader_plugin_runai.tensor",
)

NOT_IN_A_LOCAL_LOAD = (
    *NOT_AT_DISCOVERY,
    "loader._cli",
    "loader._registry.cache",
    "loader._registry.capabilities",
    "loader._registry.fingerprint",
    "loader._registry.probe",
    "loader._known_plugins",
    "loader._pipeline.remote_index",
    "loader._sources.hub",
    "loader._sources.hub_files",
    "loader.testing",
    "loader_plugin_bnb.config",
    "loader_plugin_bnb.detection",
    "loader_plugin_bnb.quant_state",
    "loader_plugin_marlin.config",
    "loader_plugin_marlin.detection",
    "loader_plugin_mistral.native_layout",
    "loader_plugin_runai.uri",
    "loader_plugin_transformers.gguf_config",
    "loader_plugin_gguf.format.detect",
)

_LOAD = """
import json, sys
import loader
for impl in ("auto", "transformers"):
    model, report = loader.load_model_with_report(sys.argv[1], dtype="float32", model_impl=impl)
    assert report.model_impl == ("native" if impl == "auto" else "transformers"), report
print(json.dumps(sorted(sys.modules)))
"""

_DISCOVER = """
import json, sys
from loader._registry import get_registry
registry = get_registry()
registry.entries()
if registry.fallback is not None:
    registry.load_class(registry.fallback.architecture)
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(code: str, *args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.needs_plugins
def test_plugin_discovery_and_the_fallback_class_leave_unused_modules_out() -> None:
    pytest.importorskip("loader_plugin_runai")
    loaded = _modules_after(_DISCOVER)
    assert "loader_plugin_runai.plugin" in loaded  # the plugin was discovered
    assert sorted(loaded & set(NOT_AT_DISCOVERY)) == []


@pytest.mark.needs_plugins
def test_a_local_safetensors_load_leaves_unused_modules_out(tmp_path) -> None:
    for plugin in ("loader_plugin_runai", "loader_plugin_bnb", "loader_plugin_marlin", "loader_plugin_mistral",
                   "loader_plugin_transformers", "loader_plugin_llama"):
        pytest.importorskip(plugin)
    from tests.helpers.hf_checkpoints import save_checkpoint

    save_checkpoint("llama", tmp_path)
    loaded = _modules_after(_LOAD, str(tmp_path))
    # the load went through the entry points whose heavy modules must stay out
    assert {"loader_plugin_bnb.plugin", "loader_plugin_marlin.plugin", "loader_plugin_mistral.plugin",
            "loader_plugin_runai.plugin", "loader_plugin_transformers.model"} <= loaded
    assert sorted(loaded & set(NOT_IN_A_LOCAL_LOAD)) == []


@pytest.mark.needs_plugins
@pytest.mark.parametrize("package", ["loader_plugin_bnb", "loader_plugin_marlin"])
def test_the_quantization_packages_still_export_their_names_on_first_use(package: str) -> None:
    pytest.importorskip(package)
    code = (f"import json, sys, {package} as p; before = '{package}.config' in sys.modules; "
            "names = [n for n in p.__all__ if getattr(p, n, None) is None]; "
            f"print(json.dumps([before, names, '{package}.config' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [False, [], True]


@pytest.mark.needs_plugins
def test_the_runai_package_still_exports_its_names_on_first_use() -> None:
    pytest.importorskip("loader_plugin_runai")
    code = ("import json, sys, loader_plugin_runai as p; before = 'loader_plugin_runai.object_folder' in sys.modules; "
            "names = [n for n in p.__all__ if getattr(p, n, None) is None]; "
            "print(json.dumps([before, names, 'loader_plugin_runai.object_folder' in sys.modules]))")
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
