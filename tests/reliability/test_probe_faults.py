"""Probe faults through ``loader models``, and probe-cache damage not covered by the registry's own tests.

tests/core/test_registry_probe.py checks the registry API against a crashing,
hanging or babbling probe child, and tests/core/test_registry_cache.py the
cache against JSON-level corruption and two concurrent processes. Here: the
same faults as the CLI user meets them (one broken plugin must not hide the
others' rows; a bad ``LOADER_PROBE_TIMEOUT`` is one line, exit 2), the parent
staying healthy afterwards, and byte-level cache damage.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import loader
from loader._cli.main import main
from loader._plugins import create_plugin_host, use_plugin_host
from loader._registry import ModelRegistry, ProbeCache
from loader._registry import probe as probe_module
from tests.helpers.malformed import write_llama_checkpoint
from tests.helpers.toy_models import TOY_WITHOUT_TORCH, forget_module, write_module

CRASHES_ON_IMPORT = """
import os, sys
sys.stderr.write("fatal: the model module exploded\\n")
sys.stderr.flush()
os._exit(7)
"""

HANGS_ON_IMPORT = """
import sys, time
sys.stderr.write("loading forever\\n")
sys.stderr.flush()
time.sleep(60)
"""


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LOADER_PROBE_IN_PROCESS", raising=False)
    monkeypatch.delenv("LOADER_PROBE_TIMEOUT", raising=False)




class _Registers:
    """An in-process model plugin registering ``architecture -> class path`` pairs."""

    def __init__(self, entries: dict[str, str]) -> None:
        self.entries = entries

    @loader.hookimpl
    def loader_register_architectures(self, register: Any) -> None:
        for arch, path in self.entries.items():
            register(arch, path)


def _models_json(entries: dict[str, str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any, str]:
    host = create_plugin_host(load_entry_points=False)
    host.register(_Registers(entries), "toys")
    with use_plugin_host(host):
        code = main(["models", "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else None, err


def test_a_crashing_model_module_does_not_hide_the_other_rows(toys, capsys) -> None:
    good, bad = toys(TOY_WITHOUT_TORCH), toys(CRASHES_ON_IMPORT)
    code, rows, _ = _models_json({"ToyForCausalLM": f"{good}:ToyForCausalLM", "CrashForCausalLM": f"{bad}:Crash"},
                                 capsys)
    assert code == 0
    by_arch = {row["architecture"]: row for row in rows}
    crash = by_arch["CrashForCausalLM"]["error"]
    assert "'CrashForCausalLM'" in crash and "exit status 7" in crash and "the model module exploded" in crash
    assert "error" not in by_arch["ToyForCausalLM"], by_arch["ToyForCausalLM"]
    assert by_arch["ToyForCausalLM"]["supports_tensor_parallel"] is True
    assert good not in sys.modules and bad not in sys.modules


def test_a_hanging_model_module_times_out_and_the_others_still_answer(toys, capsys, monkeypatch) -> None:
    monkeypatch.setenv("LOADER_PROBE_TIMEOUT", "2")
    good, slow = toys(TOY_WITHOUT_TORCH), toys(HANGS_ON_IMPORT)
    started = time.monotonic()
    code, rows, _ = _models_json({"ToyForCausalLM": f"{good}:ToyForCausalLM", "HangForCausalLM": f"{slow}:Hang"},
                                 capsys)
    assert time.monotonic() - started < 30
    assert code == 0
    by_arch = {row["architecture"]: row for row in rows}
    assert "did not finish within 2 s" in by_arch["HangForCausalLM"]["error"]
    assert "loading forever" in by_arch["HangForCausalLM"]["error"]
    assert "error" not in by_arch["ToyForCausalLM"]


def test_garbage_from_the_child_is_a_row_error_and_the_parent_still_loads(toys, capsys, monkeypatch,
                                                                          tmp_path) -> None:
    import torch

    with monkeypatch.context() as patched:
        patched.setattr(probe_module, "child_command",
                        lambda entries: [sys.executable, "-c", "print('\\x00\\xffnot json at all')"])
        code, rows, _ = _models_json({"GarbageForCausalLM": "probefault_never.model:Garbage"}, capsys)
    assert code == 0
    assert "not the expected JSON" in rows[0]["error"] and "'GarbageForCausalLM'" in rows[0]["error"]
    assert not torch.cuda.is_initialized()
    write_llama_checkpoint(tmp_path / "model")
    assert loader.load_model(str(tmp_path / "model"), dtype="float32").config.vocab_size == 64


@pytest.mark.parametrize("value", ["soon", "-1"])
def test_bad_probe_timeout_is_one_line_exit_2(toys, capsys, monkeypatch, value: str) -> None:
    monkeypatch.setenv("LOADER_PROBE_TIMEOUT", value)
    host = create_plugin_host(load_entry_points=False)
    host.register(_Registers({"ToyForCausalLM": f"{toys(TOY_WITHOUT_TORCH)}:ToyForCausalLM"}), "toys")
    message = f"LOADER_PROBE_TIMEOUT={value!r}: expected a positive number of seconds"
    with use_plugin_host(host):
        assert main(["models"]) == 2
        assert capsys.readouterr().err == f"error: {message}\n"
        assert main(["models", "--json"]) == 2  # with --json, the error is JSON on stdout
        out, err = capsys.readouterr()
    assert err == "" and json.loads(out) == {"error": message, "type": "SettingError", "exit_code": 2}


# --- the cache ------------------------------------------------------------------------------------------


@pytest.fixture
def toy_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    name = f"probefault_{uuid.uuid4().hex[:12]}"
    root = tmp_path / "src"
    root.mkdir()
    write_module(root, f"{name}.model", TOY_WITHOUT_TORCH)
    monkeypatch.syspath_prepend(str(root))
    yield name
    forget_module(name)


def _registry(package: str) -> ModelRegistry:
    registry = ModelRegistry()
    registry.register("ToyForCausalLM", f"{package}.model:ToyForCausalLM", plugin="toy")
    return registry


def _cache_file(tmp_path: Path) -> Path:
    [path] = [p for p in (tmp_path / "cache" / "model-info").iterdir() if p.suffix == ".json"]
    return path


def _not_utf8(path: Path) -> None:
    path.write_bytes(b"\xff\xfe\x00garbage\x80")


def _truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _wrong_types(path: Path) -> None:
    data = json.loads(path.read_text())
    data["info"]["supports_quantization"] = "yes"
    path.write_text(json.dumps(data))


def _unknown_keys(path: Path) -> None:
    data = json.loads(path.read_text())
    data["info"]["runs_on_toasters"] = True
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("damage", [_not_utf8, _truncated, _wrong_types, _unknown_keys],
                         ids=["not-utf8", "truncated", "wrong-types", "unknown-keys"])
def test_damaged_cache_bytes_are_ignored_and_rewritten(toy_package: str, tmp_path: Path, damage) -> None:
    expected = _registry(toy_package).model_info("ToyForCausalLM")
    path = _cache_file(tmp_path)
    good = path.read_bytes()
    damage(path)
    assert _registry(toy_package).model_info("ToyForCausalLM") == expected
    assert path.read_bytes() == good


def test_a_folder_where_the_cache_file_belongs_only_costs_a_probe(toy_package: str, tmp_path: Path) -> None:
    expected = _registry(toy_package).model_info("ToyForCausalLM")
    path = _cache_file(tmp_path)
    path.unlink()
    path.mkdir()
    assert _registry(toy_package).model_info("ToyForCausalLM") == expected
    assert path.is_dir()
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no temporary file is left behind"


def test_a_write_interrupted_before_the_rename_leaves_no_file(toy_package: str, tmp_path: Path, monkeypatch) -> None:
    def replace_fails(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", replace_fails)
        info = _registry(toy_package).model_info("ToyForCausalLM")
    folder = tmp_path / "cache" / "model-info"
    assert list(folder.iterdir()) == []
    assert _registry(toy_package).model_info("ToyForCausalLM") == info
    assert ProbeCache(folder).load(_registry(toy_package).entry("ToyForCausalLM"),
                                   json.loads(_cache_file(tmp_path).read_text())["key"]) == info
