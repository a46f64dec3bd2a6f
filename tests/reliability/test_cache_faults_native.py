"""The compiled native helpers (``<cache root>/native``: the packing helpers and the length-prefixed reader)
under concurrency, crashes and broken disks.

The helpers are looked up once per process, so every load here runs in a fresh worker
(:mod:`tests.reliability.cache_race`): a packed GGUF load with the packed-weights bundle off, whose weights
must be the ones torch packs, and whose report's ``quantization["packing"]`` says what packed them —
``compiled`` (``compiled: <why>`` when a cached library had to be built again) or ``torch: <why not>``.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import loader
from loader import _cache_root
from loader._native_build import library_path, load_library
from loader.kernels.native_packing import SOURCE as PACKING_SOURCE
from tests.helpers.gguf_files import Q, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config
from tests.reliability.cache_mounts import fill, remount_read_only, tmpfs
from tests.reliability.cache_race import Outcome, run_at_once, state_digest

COMPILER = shutil.which(os.environ.get("CC") or "cc")
pytestmark = pytest.mark.skipif(COMPILER is None, reason="no C compiler (cc) to build the helpers with")
READER_SOURCE = Path(loader.__file__).with_name("length_prefixed.c")
ABIS = {PACKING_SOURCE: ("loader_repack_abi", 4), READER_SOURCE: ("loader_records_abi", 1)}


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A tiny Q4_1 Llama GGUF and the digest of its weights packed by torch (no cache of any kind)."""
    model = build_model("llama", tiny_config("llama", vocab_size=288, rope_scaling=None))
    path = write_gguf(tmp_path_factory.mktemp("native") / "m.gguf", model, "llama", qtype=Q.Q4_1)
    return path, state_digest(loader.load_model(str(path), quantization="gguf",
                                                format_options={"packed_cache": False}))


def _env(cache: Path) -> dict[str, str]:
    return {"LOADER_CACHE_DIR": str(cache), "LOADER_GGUF_PACKED_CACHE": "0", "LOADER_NATIVE_REPACK": "1"}


def _load(gguf: tuple[Path, str], cache: Path, processes: int = 1, fault: str | None = None) -> list[Outcome]:
    path, _ = gguf
    return run_at_once("gguf_load", processes, _env(cache), [str(path)], fault=fault)


def _assert_loaded(outcomes: list[Outcome], gguf: tuple[Path, str], packing: str) -> list[dict[str, Any]]:
    """Every worker loaded torch's weights and reports ``packing`` (a prefix of it)."""
    assert [o.exitcode for o in outcomes] == [0] * len(outcomes), outcomes
    results = [o.result for o in outcomes]
    assert all(r is not None and "error" not in r for r in results), results
    assert {r["digest"] for r in results} == {gguf[1]}  # type: ignore[index]
    assert all(r["quantization"]["packing"].startswith(packing) for r in results), results  # type: ignore[index]
    return results  # type: ignore[return-value]


def _assert_whole_libraries(folder: Path) -> None:
    """One library per source, each loading and answering its ABI; no build scratch left by a live build."""
    for source, (symbol, version) in ABIS.items():
        [library] = folder.glob(f"{source.stem}-*.so")
        assert library == library_path(COMPILER or "cc", source.name, source.read_bytes())
        assert getattr(ctypes.CDLL(str(library)), symbol)() == version


@pytest.fixture(autouse=True)
def _cache_of_this_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_cache_root, "_warned", False)


@pytest.mark.parametrize("processes", [2, 8])
def test_processes_building_at_once_all_load_and_leave_one_whole_library_each(gguf, tmp_path, processes) -> None:
    _assert_loaded(_load(gguf, tmp_path / "cache", processes), gguf, "compiled")
    folder = tmp_path / "cache" / "native"
    _assert_whole_libraries(folder)
    assert sorted(p.suffix for p in folder.iterdir()) == [".so", ".so"], "a build's scratch folder was left"


def test_a_build_killed_mid_write_leaves_scratch_the_next_load_ignores(gguf, tmp_path) -> None:
    [dead] = _load(gguf, tmp_path / "cache", fault="kill_native_builder")
    assert dead.exitcode == -9 and dead.result is None
    folder = tmp_path / "cache" / "native"
    [scratch] = [p for p in folder.iterdir() if p.name.startswith(".build-")]
    half = {p.name: p.read_bytes() for p in scratch.iterdir()}
    assert any(name.endswith(".so") for name in half) and not list(folder.glob("*.so"))

    _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "compiled")
    _assert_whole_libraries(folder)
    assert [p for p in folder.iterdir() if p.suffix != ".so"] == [scratch]
    assert {p.name: p.read_bytes() for p in scratch.iterdir()} == half, "nothing reads or writes a dead build"


def test_a_read_only_cache_folder_leaves_torch_packing_and_says_why(gguf, tmp_path) -> None:
    with tmpfs(tmp_path / "cache"):
        remount_read_only(tmp_path / "cache")
        [result] = _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "torch: ")
    assert "Read-only file system" in result["quantization"]["packing"]


def test_a_read_only_cache_folder_still_serves_the_libraries_it_holds(gguf, tmp_path) -> None:
    with tmpfs(tmp_path / "cache"):
        _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "compiled")
        remount_read_only(tmp_path / "cache")
        [result] = _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "compiled")
    assert result["quantization"]["packing"] == "compiled"


def test_a_full_file_system_leaves_torch_packing_says_why_and_no_scratch(gguf, tmp_path) -> None:
    with tmpfs(tmp_path / "cache", size="64k"):
        fill(tmp_path / "cache")
        [result] = _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "torch: ")
        assert sorted(p.name for p in (tmp_path / "cache").rglob("*")) in (["filler"], ["filler", "native"])
    assert "No space left on device" in result["quantization"]["packing"]


def test_a_file_where_the_cache_folder_belongs_leaves_torch_packing(gguf, tmp_path) -> None:
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "native").write_text("not a folder")
    [result] = _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "torch: ")
    assert "Not a directory" in result["quantization"]["packing"] or "exists" in result["quantization"]["packing"]
    assert (tmp_path / "cache" / "native").read_text() == "not a folder"


def _forge_library(tmp_path: Path, body: bytes | None) -> None:
    """Under each helper's cache name: a library of another ABI (as another loader's build would be), or
    ``body`` when given."""
    for source, (symbol, version) in ABIS.items():
        target = library_path(COMPILER or "cc", source.name, source.read_bytes())
        target.parent.mkdir(parents=True, exist_ok=True)
        if body is not None:
            target.write_bytes(body)
            continue
        c_file = tmp_path / f"{source.stem}-other.c"
        c_file.write_text(f"int {symbol}(void) {{ return {version + 40}; }}\n")
        subprocess.run([COMPILER or "cc", "-shared", "-fPIC", "-o", str(target), str(c_file)], check=True)


@pytest.mark.parametrize("body", [None, b"\x7fELF but not a library", b""], ids=["other-abi", "damaged", "empty"])
def test_a_cached_library_of_another_build_is_built_again_and_noted(gguf, tmp_path, body) -> None:
    _forge_library(tmp_path, body)
    [result] = _assert_loaded(_load(gguf, tmp_path / "cache"), gguf, "compiled: rebuilt native_packing-")
    assert "the cached library" in result["quantization"]["packing"]
    _assert_whole_libraries(tmp_path / "cache" / "native")


def test_a_source_changed_to_the_same_size_and_mtime_is_built_again(tmp_path) -> None:
    """The library's name digests the source's bytes, so any change of them names another library."""
    source = tmp_path / "answer.c"
    source.write_text("int loader_answer_abi(void) { return 41; }\n")
    assert load_library(COMPILER or "cc", source, ("loader_answer_abi", 41)).library.loader_answer_abi() == 41
    before = source.stat()
    with source.open("r+") as handle:
        handle.write("int loader_answer_abi(void) { return 42; }\n")
    os.utime(source, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (source.stat().st_size, source.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert load_library(COMPILER or "cc", source, ("loader_answer_abi", 42)).library.loader_answer_abi() == 42
    assert len(list((tmp_path / "cache" / "native").glob("answer-*.so"))) == 2
