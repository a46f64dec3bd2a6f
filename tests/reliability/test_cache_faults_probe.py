"""The registry's probe cache (``<cache root>/model-info``) under concurrency, crashes and broken disks.

Every case: the info asked for is the class's own (as a probe in this process says), the cache holds at most
one whole entry for the architecture afterwards and no temporary file a live writer left, and the cache's
notes (:attr:`loader._registry.ProbeCache.notes`) say what went wrong with it. The "first load" of a probe
cache is the first ``model_info`` of an architecture: a probe child, then a write.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from loader import _cache_root
from loader._registry import ModelInfo, ModelRegistry, ProbeCache
from loader._registry.capabilities import inspect_model_class
from loader._registry.fingerprint import cache_key, source_fingerprint
from tests.helpers.toy_models import TOY_WITHOUT_TORCH, forget_module, write_module
from tests.reliability.cache_mounts import fill, remount_read_only, tmpfs
from tests.reliability.cache_race import run_at_once

ARCH = "ToyForCausalLM"


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, str]]:
    """A toy model package under ``tmp_path/src`` on ``sys.path``; the cache under ``tmp_path/cache``."""
    name = f"cachetoy_{uuid.uuid4().hex[:12]}"
    root = tmp_path / "src"
    root.mkdir()
    write_module(root, f"{name}.model", TOY_WITHOUT_TORCH)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADER_PROBE_IN_PROCESS", raising=False)
    monkeypatch.setattr(_cache_root, "_warned", False)
    yield root, name
    forget_module(name)


def _expected(package: str) -> ModelInfo:
    """The info a probe in this process gives (imports the toy here; the registry never does)."""
    info = inspect_model_class(ARCH, __import__(f"{package}.model", fromlist=["x"]).ToyForCausalLM)
    forget_module(package)
    return info


def _registry(package: str) -> ModelRegistry:
    registry = ModelRegistry()
    registry.register(ARCH, f"{package}.model:{ARCH}", plugin="toy")
    return registry


def _folder(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "model-info"


def _entries(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".json") if folder.is_dir() else []


def _temps(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == ".tmp") if folder.is_dir() else []


def _assert_one_whole_entry(folder: Path, package: str, expected: ModelInfo) -> None:
    [entry] = _entries(folder)
    registry = _registry(package)
    key = cache_key(registry.entry(ARCH), source_fingerprint(package) or "")
    assert ProbeCache(folder).load(registry.entry(ARCH), key) == expected
    assert entry == ProbeCache(folder).path_for(registry.entry(ARCH), key)


def _env(tmp_path: Path) -> dict[str, str]:
    return {"LOADER_CACHE_DIR": str(tmp_path / "cache"), "LOADER_PROBE_IN_PROCESS": "0"}


@pytest.mark.parametrize("processes", [2, 8])
def test_processes_probing_at_once_all_answer_and_leave_one_whole_entry(toy, tmp_path, processes) -> None:
    root, package = toy
    outcomes = run_at_once("probe_info", processes, _env(tmp_path), [str(root), package, ARCH])
    expected = _expected(package)
    assert [o.exitcode for o in outcomes] == [0] * processes
    assert all(o.result == {"info": expected.to_json(), "notes": []} for o in outcomes), outcomes
    _assert_one_whole_entry(_folder(tmp_path), package, expected)
    assert _temps(_folder(tmp_path)) == []


def test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_probe_ignores(toy, tmp_path) -> None:
    root, package = toy
    [dead] = run_at_once("probe_info", 1, _env(tmp_path), [str(root), package, ARCH],
                         fault="kill_probe_cache_writer")
    assert dead.exitcode == -9 and dead.result is None
    [partial] = _temps(_folder(tmp_path))
    left = partial.read_bytes()
    assert _entries(_folder(tmp_path)) == [] and len(left) > 0

    [fresh] = run_at_once("probe_info", 1, _env(tmp_path), [str(root), package, ARCH])
    expected = _expected(package)
    assert fresh.exitcode == 0 and fresh.result == {"info": expected.to_json(), "notes": []}
    _assert_one_whole_entry(_folder(tmp_path), package, expected)
    assert all(p == partial and p.read_bytes() == left for p in _temps(_folder(tmp_path)))


def test_a_read_only_cache_folder_costs_a_probe_and_is_noted(toy, tmp_path) -> None:
    _, package = toy
    with tmpfs(tmp_path / "cache"):
        remount_read_only(tmp_path / "cache")
        registry = _registry(package)
        assert registry.model_info(ARCH) == _expected(package)
    assert len(registry.cache.notes) == 1 and "Read-only file system" in registry.cache.notes[0]


def test_a_read_only_cache_folder_still_answers_from_what_it_holds(toy, tmp_path, children) -> None:
    _, package = toy
    with tmpfs(tmp_path / "cache"):
        expected = _registry(package).model_info(ARCH)
        remount_read_only(tmp_path / "cache")
        children.clear()
        registry = _registry(package)
        assert registry.model_info(ARCH) == expected and children == []
        assert registry.cache.notes == []


def test_a_full_file_system_costs_a_probe_is_noted_and_leaves_no_temp_file(toy, tmp_path) -> None:
    _, package = toy
    with tmpfs(tmp_path / "cache", size="64k"):
        _folder(tmp_path).mkdir()
        fill(tmp_path / "cache")
        registry = _registry(package)
        assert registry.model_info(ARCH) == _expected(package)
        assert list(_folder(tmp_path).iterdir()) == []
    assert len(registry.cache.notes) == 1 and "No space left on device" in registry.cache.notes[0]


def test_a_file_where_the_cache_folder_belongs_costs_a_probe_and_is_noted(toy, tmp_path) -> None:
    _, package = toy
    (tmp_path / "cache").mkdir()
    _folder(tmp_path).write_text("not a folder")
    registry = _registry(package)
    assert registry.model_info(ARCH) == _expected(package)
    assert len(registry.cache.notes) == 1 and "not written" in registry.cache.notes[0]
    assert _folder(tmp_path).read_text() == "not a folder"


def _forge(folder: Path, name_key: str, key: str, package: str, **changes: object) -> Path:
    """An entry named for ``name_key`` holding ``key`` and, in its info, ``changes`` (a wrong answer)."""
    registry = _registry(package)
    info = ModelInfo.from_json({**_expected(package).to_json(), **changes})
    path = ProbeCache(folder).path_for(registry.entry(ARCH), name_key)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 2, "key": key, "architecture": ARCH,
                                "class_path": registry.entry(ARCH).class_path, "packages": {},
                                "info": info.to_json()}))
    return path


def test_an_entry_of_another_torch_or_loader_is_never_read_and_is_pruned(toy, tmp_path) -> None:
    _, package = toy
    other = "e" * 64  # another environment's key: another file name
    forged = _forge(_folder(tmp_path), other, other, package, supports_quantization=False)
    registry = _registry(package)
    assert registry.model_info(ARCH) == _expected(package) and registry.cache.notes == []
    assert not forged.exists()
    _assert_one_whole_entry(_folder(tmp_path), package, _expected(package))


@pytest.mark.parametrize(("stored", "note"), [
    ({"key": "another"}, "written for another key or format"),
    ({"format": 1}, "written for another key or format"),
    ({"packages": {"torch_extension_of_old": "0" * 64}}, "a package of the class's MRO changed"),
], ids=["other-key", "other-format", "other-base-class-sources"])
def test_a_forged_entry_under_this_key_is_ignored_noted_and_rewritten(toy, tmp_path, stored, note) -> None:
    _, package = toy
    key = cache_key(_registry(package).entry(ARCH), source_fingerprint(package) or "")
    forged = _forge(_folder(tmp_path), key, key, package, supports_quantization=False)
    forged.write_text(json.dumps({**json.loads(forged.read_text()), **stored}))
    registry = _registry(package)
    assert registry.model_info(ARCH) == _expected(package)
    assert len(registry.cache.notes) == 1 and note in registry.cache.notes[0], registry.cache.notes
    _assert_one_whole_entry(_folder(tmp_path), package, _expected(package))


def test_a_source_changed_to_the_same_size_and_mtime_is_probed_again(toy, tmp_path) -> None:
    """The key digests each source's path, size, mtime, inode and ctime: rewriting a file in place and
    restoring its mtime still changes its ctime, which the kernel sets and no caller can restore."""
    root, package = toy
    assert _registry(package).model_info(ARCH).tied_embeddings_supported is True
    model = root / package / "model.py"
    before = model.stat()
    text = model.read_text()
    changed = text.replace("tied_embeddings_supported = True", "tied_embeddings_supported = 1>2 ")
    assert len(changed) == len(text) and changed != text
    with model.open("r+") as handle:  # in place: the same inode
        handle.write(changed)
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = model.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert _registry(package).model_info(ARCH).tied_embeddings_supported is False
    assert len(_entries(_folder(tmp_path))) == 1
