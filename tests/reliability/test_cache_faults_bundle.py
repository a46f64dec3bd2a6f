"""The packed-weights bundle (``<cache root>/gguf-packed``, written by packed GGUF loads) under concurrency,
crashes and broken disks.

Every load here must give the weights a load without the bundle packs, and its report's
``quantization["packed_cache"]`` (hits, misses, written, notes) must say what the bundle did.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

import loader
from loader import _cache_root
from loader.errors import LoadError
from tests.helpers.gguf_files import Q, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config
from tests.reliability.cache_mounts import fill, remount_read_only, tmpfs
from tests.reliability.cache_race import Outcome, run_at_once, state_digest


def _write(path: Path, seed: int) -> Path:
    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None), seed=seed)
    return write_gguf(path, model, "llama", qtype=Q.Q4_1)


def _unbundled_digest(path: Path) -> str:
    return state_digest(loader.load_model(str(path), quantization="gguf", format_options={"packed_cache": False}))


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny Q4_1 Llama GGUF and the digest of its weights packed without a bundle."""
    path = _write(tmp_path_factory.mktemp("bundle") / "m.gguf", seed=0)
    return path, _unbundled_digest(path)


@pytest.fixture(autouse=True)
def _bundle_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "1")
    monkeypatch.setattr(_cache_root, "_warned", False)


def _folder(tmp_path: Path) -> Path:
    return tmp_path / "cache" / "gguf-packed"


def _files(folder: Path, suffix: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix == suffix) if folder.is_dir() else []


def _load(gguf: tuple[Path, str], tmp_path: Path, processes: int = 1, fault: str | None = None) -> list[Outcome]:
    # no compiler: the workers pack with torch (the same bytes) instead of each building the native helpers
    env = {"LOADER_CACHE_DIR": str(tmp_path / "cache"), "LOADER_GGUF_PACKED_CACHE": "1", "CC": "no-compiler-here"}
    return run_at_once("gguf_load", processes, env, [str(gguf[0])], fault=fault)


def _here(gguf: tuple[Path, str]) -> dict[str, Any]:
    """A load in this process: the weights must be the unbundled ones; returns the bundle's report."""
    model, report = loader.load_model_with_report(str(gguf[0]), quantization="gguf")
    assert state_digest(model) == gguf[1]
    return (report.quantization or {})["packed_cache"]


def _assert_reused(gguf: tuple[Path, str], tmp_path: Path) -> None:
    """The folder holds one whole bundle, no temporary file, and a fresh process maps every unit from it."""
    [bundle] = _files(_folder(tmp_path), ".bin")
    [again] = _load(gguf, tmp_path)
    assert again.result is not None and again.result["digest"] == gguf[1]
    described = again.result["quantization"]["packed_cache"]
    assert described["path"] == str(bundle) and described["misses"] == 0 and described["hits"] > 0
    assert described["notes"] == []


@pytest.mark.parametrize("processes", [2, 8])
def test_processes_packing_at_once_all_load_and_leave_one_whole_bundle(gguf, tmp_path, processes) -> None:
    outcomes = _load(gguf, tmp_path, processes)
    assert [o.exitcode for o in outcomes] == [0] * processes
    assert {o.result["digest"] for o in outcomes if o.result} == {gguf[1]}, outcomes
    assert all(o.result and o.result["quantization"]["packed_cache"]["notes"] == [] for o in outcomes)
    assert _files(_folder(tmp_path), ".tmp") == []
    _assert_reused(gguf, tmp_path)


def test_a_writer_killed_mid_write_leaves_a_temp_file_the_next_load_ignores(gguf, tmp_path) -> None:
    [dead] = _load(gguf, tmp_path, fault="kill_bundle_writer")
    assert dead.exitcode == -9 and dead.result is None
    [partial] = _files(_folder(tmp_path), ".tmp")
    left = partial.read_bytes()
    assert _files(_folder(tmp_path), ".bin") == [] and len(left) > 0

    [fresh] = _load(gguf, tmp_path)
    assert fresh.result is not None and fresh.result["digest"] == gguf[1]
    assert fresh.result["quantization"]["packed_cache"]["written"]
    assert all(p == partial and p.read_bytes() == left for p in _files(_folder(tmp_path), ".tmp"))
    _assert_reused(gguf, tmp_path)


def test_a_dead_writer_s_temp_file_an_hour_old_is_removed_by_the_next_write(gguf, tmp_path) -> None:
    _folder(tmp_path).mkdir(parents=True)
    stale = _folder(tmp_path) / "0123456789abcdef.x1y2z3.tmp"
    stale.write_bytes(b"LDRGGPK\x01" + bytes(100))
    os.utime(stale, (0, 0))
    assert _here(gguf)["written"]
    assert not stale.exists()


def test_a_read_only_cache_folder_packs_and_notes_it(gguf, tmp_path) -> None:
    with tmpfs(tmp_path / "cache"):
        remount_read_only(tmp_path / "cache")
        described = _here(gguf)
    assert not described["written"] and described["hits"] == 0
    assert len(described["notes"]) == 1 and "Read-only file system" in described["notes"][0]


def test_a_read_only_cache_folder_still_serves_the_bundle_it_holds(gguf, tmp_path) -> None:
    with tmpfs(tmp_path / "cache"):
        assert _here(gguf)["written"]
        remount_read_only(tmp_path / "cache")
        described = _here(gguf)
    assert described["misses"] == 0 and described["hits"] > 0 and described["notes"] == []


def test_a_full_file_system_packs_notes_it_and_leaves_no_temp_file(gguf, tmp_path) -> None:
    with tmpfs(tmp_path / "cache", size="256k"):
        _folder(tmp_path).mkdir()
        fill(tmp_path / "cache")
        described = _here(gguf)
        assert list(_folder(tmp_path).iterdir()) == []
    assert not described["written"]
    assert len(described["notes"]) == 1 and "No space left on device" in described["notes"][0]


def test_a_file_where_the_cache_folder_belongs_packs_and_notes_it(gguf, tmp_path) -> None:
    _folder(tmp_path).parent.mkdir()
    _folder(tmp_path).write_text("not a folder")
    described = _here(gguf)
    assert not described["written"] and len(described["notes"]) == 1 and "not written" in described["notes"][0]
    assert _folder(tmp_path).read_text() == "not a folder"


def test_a_bundle_of_another_torch_cpu_or_loader_is_never_mapped(gguf, tmp_path) -> None:
    """Such a bundle has another name (the digest of its identity); one forged under this load's name is
    compared in full and refused (tests/plugins/gguf/packed/test_bundle_keys.py: ``other-torch``)."""
    assert _here(gguf)["written"]
    [ours] = _files(_folder(tmp_path), ".bin")
    other = ours.with_name("f" * 32 + ".bin")  # as the same file packed under another torch would be named
    shutil.copyfile(ours, other)
    ours.unlink()
    described = _here(gguf)
    assert described["hits"] == 0 and described["written"] and described["notes"] == []
    assert other.exists() and ours.exists()


def test_a_source_rewritten_to_the_same_size_and_mtime_misses_and_packs_its_new_weights(gguf, tmp_path) -> None:
    """The bundle's identity holds each file's size, mtime, inode and ctime: rewriting the file in place and
    restoring its mtime still changes its ctime, which no caller can set back."""
    path = _write(tmp_path / "m.gguf", seed=0)
    assert _here((path, _unbundled_digest(path)))["written"]
    other = _write(tmp_path / "other.gguf", seed=1).read_bytes()
    before = path.stat()
    assert len(other) == before.st_size
    with path.open("r+b") as handle:
        handle.write(other)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    described = _here((path, _unbundled_digest(path)))
    assert described["hits"] == 0 and described["written"]
    assert len(_files(_folder(tmp_path), ".bin")) == 2


def test_a_source_cut_short_after_its_bundle_was_written_fails_by_name(gguf, tmp_path) -> None:
    path = shutil.copyfile(gguf[0], tmp_path / "m.gguf")
    assert _here((path, gguf[1]))["written"]
    with path.open("r+b") as handle:
        handle.truncate(path.stat().st_size - 4096)
    with pytest.raises(LoadError, match="m.gguf"):
        loader.load_model(str(path), quantization="gguf")
