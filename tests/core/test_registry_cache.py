"""The probe cache on disk: hits, invalidation by source changes, corruption, concurrent writers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from loader._registry import ModelInfo, ModelRegistry, ProbeCache, RegisteredModel
from loader._registry.cache import default_cache_dir
from loader._registry.fingerprint import source_fingerprint
from tests.helpers.toy_models import TOY_WITHOUT_TORCH, forget_module, write_module


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADER_PROBE_IN_PROCESS", raising=False)
    monkeypatch.delenv("LOADER_PROBE_TIMEOUT", raising=False)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """A toy package ``<name>.model`` (with a sibling ``layers`` module) on sys.path."""
    name = f"regtoy_{uuid.uuid4().hex[:12]}"
    root = tmp_path / "src"
    root.mkdir()
    write_module(root, f"{name}.layers", "HIDDEN = 64\n")
    write_module(root, f"{name}.model", TOY_WITHOUT_TORCH)
    monkeypatch.syspath_prepend(str(root))
    yield name, root / name
    forget_module(name)




def fresh_registry(package: str) -> ModelRegistry:
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{package}.model:ToyForCausalLM", plugin="toy")
    return registry


def cache_files(tmp_path):
    folder = tmp_path / "cache" / "model-info"
    return sorted(p for p in folder.iterdir() if p.suffix == ".json") if folder.exists() else []


def test_second_registry_answers_from_the_cache(toy, children, tmp_path):
    package, _ = toy
    first = fresh_registry(package).model_info("ToyForCausalLM")
    assert len(children) == 1
    [path] = cache_files(tmp_path)
    assert path.name.startswith("ToyForCausalLM-")
    assert json.loads(path.read_text())["info"] == first.to_json()

    assert fresh_registry(package).model_info("ToyForCausalLM") == first
    assert len(children) == 1, "the cache hit must not start a child"
    assert f"{package}.model" not in sys.modules


def test_changing_any_source_of_the_package_invalidates(toy, children):
    package, folder = toy
    assert fresh_registry(package).model_info("ToyForCausalLM").tied_embeddings_supported is True
    model = folder / "model.py"
    model.write_text(model.read_text().replace("tied_embeddings_supported = True",
                                               "tied_embeddings_supported = False  # changed"))
    assert fresh_registry(package).model_info("ToyForCausalLM").tied_embeddings_supported is False
    assert len(children) == 2

    (folder / "layers.py").write_text("HIDDEN = 128  # a sibling changed\n")
    fresh_registry(package).model_info("ToyForCausalLM")
    assert len(children) == 3


def test_changing_the_package_of_a_base_class_invalidates(tmp_path, children, monkeypatch):
    """The class's own package is not enough: a base class from another distribution changes the answer too."""
    base, sub = f"regbase_{uuid.uuid4().hex[:12]}", f"regsub_{uuid.uuid4().hex[:12]}"
    root = tmp_path / "src"
    root.mkdir()
    write_module(root, f"{base}.bases", "class Base:\n    tied_embeddings_supported = True\n")
    write_module(root, f"{sub}.model", f"from {base}.bases import Base\n\nclass ToyForCausalLM(Base):\n"
                                        "    is_text_generation_model = True\n")
    monkeypatch.syspath_prepend(str(root))
    try:
        assert fresh_registry(sub).model_info("ToyForCausalLM").tied_embeddings_supported is True
        assert fresh_registry(sub).model_info("ToyForCausalLM").tied_embeddings_supported is True
        assert len(children) == 1
        bases = root / base / "bases.py"
        bases.write_text("class Base:\n    tied_embeddings_supported = False  # changed\n")
        assert fresh_registry(sub).model_info("ToyForCausalLM").tied_embeddings_supported is False
        assert len(children) == 2
    finally:
        forget_module(base)
        forget_module(sub)


def test_stale_entries_of_an_architecture_are_pruned(toy, children, tmp_path):
    package, folder = toy
    fresh_registry(package).model_info("ToyForCausalLM")
    (folder / "layers.py").write_text("HIDDEN = 128  # changed\n")
    fresh_registry(package).model_info("ToyForCausalLM")
    (folder / "layers.py").write_text("HIDDEN = 256  # changed again\n")
    fresh_registry(package).model_info("ToyForCausalLM")
    assert len(children) == 3
    assert len(cache_files(tmp_path)) == 1


def test_the_probe_sources_in_the_key_exist():
    from loader._registry.fingerprint import probe_sources

    assert all(path.is_file() for path in probe_sources())


def test_source_fingerprint_covers_the_package_without_importing_it(toy):
    package, folder = toy
    before = source_fingerprint(package)
    assert before is not None and package not in sys.modules
    assert source_fingerprint(package) == before
    (folder / "extra.py").write_text("X = 1\n")
    assert source_fingerprint(package) != before
    assert source_fingerprint("regtoy_not_installed_anywhere") is None


@pytest.mark.parametrize("corruption", ["{not json", "", '{"format": 1, "key": "other"}', "[1, 2]",
                                        '{"format": 1, "info": {"architecture": "ToyForCausalLM"}}'])
def test_corrupt_cache_file_is_probed_again_and_rewritten(toy, children, tmp_path, corruption):
    package, _ = toy
    expected = fresh_registry(package).model_info("ToyForCausalLM")
    [path] = cache_files(tmp_path)
    good = json.loads(path.read_text())
    path.write_text(corruption)

    assert fresh_registry(package).model_info("ToyForCausalLM") == expected
    assert len(children) == 2
    assert json.loads(path.read_text()) == good


def test_cache_for_another_key_is_ignored(tmp_path):
    cache = ProbeCache(tmp_path / "c")
    entry = RegisteredModel("ToyForCausalLM", "toy", "toy.model:Toy")
    info = ModelInfo("ToyForCausalLM", supports_quantization=True)
    cache.store(entry, "a" * 64, info)
    assert cache.load(entry, "a" * 64) == info
    assert cache.load(entry, "a" * 40 + "b" * 24) is None, "same file name, other key"
    assert cache.load(RegisteredModel("ToyForCausalLM", "toy", "toy.other:Toy"), "a" * 64) is None
    names = [p.name for p in (tmp_path / "c").iterdir()]
    assert names == [f"ToyForCausalLM-{'a' * 40}.json"], "no temporary files are left"


def test_unwritable_cache_folder_only_costs_a_probe(toy, children, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(blocker))
    package, _ = toy
    assert fresh_registry(package).model_info("ToyForCausalLM").supports_quantization
    assert fresh_registry(package).model_info("ToyForCausalLM").supports_quantization
    assert len(children) == 2


def test_cache_folder_follows_loader_cache_dir(monkeypatch, tmp_path):
    assert default_cache_dir() == tmp_path / "cache" / "model-info"
    monkeypatch.delenv("LOADER_CACHE_DIR")
    import platformdirs

    assert default_cache_dir() == Path(platformdirs.user_cache_dir("loader")) / "model-info"


CONCURRENT_PROBE = """
import json, sys
from loader._registry import ModelRegistry
registry = ModelRegistry()
for i in range({count}):
    registry.register(f"Toy{{i}}ForCausalLM", "{package}.model:ToyForCausalLM", plugin="toy")
print(json.dumps(sorted(registry.model_infos())))
"""


def test_two_processes_probing_at_once_leave_a_valid_cache(toy, tmp_path, children):
    package, folder = toy
    count = 12
    script = textwrap.dedent(CONCURRENT_PROBE.format(count=count, package=package))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(folder.parent), *sys.path])}
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert len(json.loads(out)) == count

    files = cache_files(tmp_path)
    assert len(files) == count
    for path in files:
        assert json.loads(path.read_text())["info"]["supports_tensor_parallel"] is True
    assert not [p for p in (tmp_path / "cache" / "model-info").iterdir() if p.suffix != ".json"]

    children.clear()
    registry = ModelRegistry()
    for i in range(count):
        registry.register(f"Toy{i}ForCausalLM", f"{package}.model:ToyForCausalLM", plugin="toy")
    assert len(registry.model_infos()) == count
    assert children == [], "every architecture was in the cache"
