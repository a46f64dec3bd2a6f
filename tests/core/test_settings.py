"""Environment variables: one declaration each (loader._settings), one parse path (loader.settings), one error.

For every variable the core reads, a bad value raises :class:`loader.errors.SettingError` from the code that
reads it, with the message a user sees (``NAME='value': expected ...``, the CLI's ``error:`` line);
``LOADER_READ_THREADS`` and ``LOADER_MAP_MIN_BYTES``, which used to fall back to their defaults in silence,
now fail a load. The GGUF plugin's two variables are checked in tests/plugins/gguf/test_settings.py.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader import _settings
from loader._cli.main import main
from loader.errors import ConfigError, LoadError, SettingError
from loader.settings import FLAG, FOLDER, Kind, Setting, integer, names, seconds
from tests.helpers.malformed import write_llama_checkpoint


def _create_host() -> object:
    from loader._plugins import create_plugin_host

    return create_plugin_host()


def _override() -> object:
    from loader._registry.registry import override_setting

    return override_setting()


def _cache_root() -> object:
    from loader.io import cache_root

    return cache_root()


def _native_repack() -> object:
    from loader.kernels import native_repack

    native_repack.cache_clear()  # the answer is kept per process; the variable is read on the first ask
    try:
        return native_repack()
    finally:
        native_repack.cache_clear()


def _in_process() -> object:
    from loader._registry.probe import wants_in_process_probe

    return wants_in_process_probe()


def _probe_timeout() -> object:
    from loader._registry.probe import probe_timeout

    return probe_timeout()


def _memory_check() -> object:
    from loader._pipeline.budget import check_fits

    return check_fits(1, torch.device("cpu"), "a model")


def _read_threads() -> object:
    from loader.io import io_threads

    return io_threads()


def _map_weights() -> object:
    from loader._mapped_parameters import mapping_enabled

    return mapping_enabled()


def _map_min_bytes() -> object:
    from loader._mapped_parameters import min_map_bytes

    return min_map_bytes()


def _kernel_measure() -> object:
    from loader.kernels import paths_from_shapes

    return paths_from_shapes(torch.float32, torch.bfloat16)


def _kernel_exact() -> object:
    from loader.kernels import exact_float32_default

    return exact_float32_default()


def _kernel_dense_budget() -> object:
    from loader.kernels import dense_budget

    return dense_budget()


def _huge_pages() -> object:
    from loader.io import advise_fresh_huge_pages

    return advise_fresh_huge_pages()


def _fused_reads() -> object:
    from loader.io import fused_reads_available

    return fused_reads_available()


def _tp_launched() -> object:
    from loader._cli.tp_launch import worker_exit

    return worker_exit(0)


PLUGIN_NAMES = "comma-separated plugin names (letters, digits, '_', '.', '-')"
YES_NO = "a yes/no value (1, true, yes, on / 0, false, no, off)"

# variable -> (a bad value, what the message says is expected, the code that reads the variable)
BAD: dict[str, tuple[str, str, Callable[[], object]]] = {
    "LOADER_PLUGINS": ("safetensors llama", PLUGIN_NAMES, _create_host),
    "LOADER_DISABLE_PLUGINS": ("qwen;llama", PLUGIN_NAMES, _create_host),
    "LOADER_OVERRIDE_ARCHITECTURES": (
        "Llama ForCausalLM", "comma-separated architecture names (letters, digits, '_', '.', '-'), or *", _override),
    "LOADER_CACHE_DIR": ("relative/cache", "an absolute path (a leading ~ is expanded)", _cache_root),
    "LOADER_NATIVE_REPACK": ("maybe", YES_NO, _native_repack),
    "LOADER_PROBE_IN_PROCESS": ("sometimes", YES_NO, _in_process),
    "LOADER_PROBE_TIMEOUT": ("soon", "a positive number of seconds", _probe_timeout),
    "LOADER_SKIP_MEMORY_CHECK": ("please", YES_NO, _memory_check),
    "LOADER_READ_THREADS": ("many", "a whole number of threads (at least 1)", _read_threads),
    "LOADER_MAP_WEIGHTS": ("mapped", YES_NO, _map_weights),
    "LOADER_MAP_MIN_BYTES": ("1MiB", "a whole number of bytes (at least 0)", _map_min_bytes),
    "LOADER_TP_LAUNCHED": ("2", YES_NO, _tp_launched),
    "LOADER_KERNEL_MEASURE": ("often", YES_NO, _kernel_measure),
    "LOADER_KERNEL_EXACT_FLOAT32": ("exact", YES_NO, _kernel_exact),
    "LOADER_KERNEL_DENSE_BUDGET": ("1GB", "a whole number of bytes (at least 0)", _kernel_dense_budget),
    "LOADER_HUGE_PAGES": ("huge", YES_NO, _huge_pages),
    "LOADER_FUSED_READS": ("fast", YES_NO, _fused_reads),
}


def test_every_declared_variable_has_a_bad_value_case() -> None:
    declared = {s.name for s in (*_settings.SETTINGS, *_settings.INTERNAL)}
    assert declared == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_a_setting_error_naming_variable_value_and_what_is_expected(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value, expected, read = BAD[name]
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as info:
        read()
    assert str(info.value) == f"{name}={value!r}: expected {expected}"
    assert (info.value.name, info.value.value, info.value.expected) == (name, value, expected)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, LoadError)


@pytest.mark.parametrize("name", sorted(BAD))
def test_unset_or_blank_is_the_default(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    setting = next(s for s in (*_settings.SETTINGS, *_settings.INTERNAL) if s.name == name)
    assert setting.read({}) == setting.default
    blank = setting.read({name: "  "})
    assert blank == (setting.default if setting.blank_is_default else frozenset())


# --- the two that used to ignore a bad value: a load now fails, naming it ------------------------------------


@pytest.fixture
def llama(tmp_path: Path) -> Path:
    write_llama_checkpoint(tmp_path / "llama", shards=1)
    return tmp_path / "llama"


@pytest.mark.needs_plugins
@pytest.mark.parametrize(("name", "value", "expected"), [
    ("LOADER_READ_THREADS", "many", "a whole number of threads (at least 1)"),
    ("LOADER_READ_THREADS", "0", "a whole number of threads (at least 1)"),
    ("LOADER_READ_THREADS", "-2", "a whole number of threads (at least 1)"),
    ("LOADER_MAP_MIN_BYTES", "1MiB", "a whole number of bytes (at least 0)"),
    ("LOADER_MAP_MIN_BYTES", "-1", "a whole number of bytes (at least 0)"),
])
def test_a_load_with_a_bad_value_that_used_to_be_ignored_now_fails(
        llama: Path, monkeypatch: pytest.MonkeyPatch, name: str, value: str, expected: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(LoadError) as info:  # before: the default was used and the load succeeded
        loader.load_model(str(llama), dtype="float32")
    assert type(info.value) is SettingError
    assert str(info.value) == f"{name}={value!r}: expected {expected}"


@pytest.mark.needs_plugins
def test_the_cli_prints_the_setting_error_on_one_line(
        llama: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("LOADER_READ_THREADS", "many")
    assert main(["load", str(llama), "--dtype", "float32"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: LOADER_READ_THREADS='many': expected a whole number of threads (at least 1)\n"


@pytest.mark.needs_plugins
def test_good_values_still_load(llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_READ_THREADS", " 2 ")
    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", "4096")
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "Off")
    assert loader.load_model(str(llama), dtype="float32").config.vocab_size == 64


def test_an_allow_list_naming_no_installed_plugin_is_a_setting_error_too() -> None:
    from loader._plugins import create_plugin_host

    with pytest.raises(SettingError, match="LOADER_PLUGINS names 'safetensorz', which no installed plugin"):
        create_plugin_host(environ={"LOADER_PLUGINS": "safetensorz"})


# --- the parse path and the kinds ------------------------------------------------------------------------------


def test_a_setting_is_read_when_asked_not_once(monkeypatch: pytest.MonkeyPatch) -> None:
    setting = Setting("LOADER_TEST_THREADS", integer(1), default=3, doc="test")
    monkeypatch.delenv("LOADER_TEST_THREADS", raising=False)
    assert setting.read() == 3
    monkeypatch.setenv("LOADER_TEST_THREADS", "5")
    assert setting.read() == 5
    monkeypatch.setenv("LOADER_TEST_THREADS", "five")
    with pytest.raises(SettingError, match=r"^LOADER_TEST_THREADS='five': expected a whole number \(at least 1\)$"):
        setting.read()


@pytest.mark.parametrize(("text", "value"), [
    ("1", True), ("true", True), ("YES", True), (" on ", True), ("0", False), ("False", False), ("no", False),
    ("OFF", False),
])
def test_flag_values(text: str, value: bool) -> None:
    assert Setting("LOADER_TEST_FLAG", FLAG, default=not value, doc="test").read({"LOADER_TEST_FLAG": text}) is value


@pytest.mark.parametrize("text", ["2", "y", "enabled", "1 0", "-1"])
def test_flag_refuses_anything_else(text: str) -> None:
    with pytest.raises(SettingError, match=r"expected a yes/no value \(1, true, yes, on / 0, false, no, off\)"):
        Setting("LOADER_TEST_FLAG", FLAG, default=True, doc="test").read({"LOADER_TEST_FLAG": text})


@pytest.mark.parametrize(("kind", "good", "bad"), [
    (integer(0), {"0": 0, "+7": 7, " 12 ": 12}, ["1.5", "1e3", "0x10", "-1", "١٢"]),
    (integer(1, unit="threads"), {"1": 1, "64": 64}, ["0", "many"]),
    (seconds(), {"2": 2.0, "0.5": 0.5, "1e3": 1000.0}, ["0", "-3", "inf", "nan", "soon"]),
    (names(), {"a, b,,c": frozenset({"a", "b", "c"}), "loader-plugin.x_y": frozenset({"loader-plugin.x_y"})},
     ["a b", "a;b", "*", "a=b"]),
    (names(star=True), {"*": frozenset({"*"}), "A,*": frozenset({"A", "*"})}, ["**", "a b"]),
    (FOLDER, {"/tmp/x": Path("/tmp/x"), "~/x": Path("~/x").expanduser()}, ["x", "./x", "../x"]),
])
def test_kinds(kind: Kind[Any], good: dict[str, object], bad: list[str]) -> None:
    setting = Setting("LOADER_TEST_VALUE", kind, default=None, doc="test")
    for text, value in good.items():
        assert setting.read({"LOADER_TEST_VALUE": text}) == value
    for text in bad:
        with pytest.raises(SettingError) as info:
            setting.read({"LOADER_TEST_VALUE": text})
        assert str(info.value) == f"LOADER_TEST_VALUE={text!r}: expected {kind.expected}"


def test_blank_plugins_list_loads_none_but_blank_elsewhere_is_the_default() -> None:
    assert _settings.PLUGINS.read({"LOADER_PLUGINS": ""}) == frozenset()
    assert _settings.PLUGINS.read({}) is None
    assert _settings.READ_THREADS.read({"LOADER_READ_THREADS": ""}) == _settings.READ_THREADS.default


def test_a_setting_is_declared_with_a_loader_name_and_a_one_line_doc() -> None:
    with pytest.raises(ValueError, match="is not LOADER_"):
        Setting("READ_THREADS", integer(), default=1, doc="x")
    with pytest.raises(ValueError, match="is not LOADER_"):
        Setting("LOADER_lower", integer(), default=1, doc="x")
    with pytest.raises(ValueError, match="one non-empty line"):
        Setting("LOADER_X", integer(), default=1, doc="two\nlines")


def test_a_setting_error_survives_pickling() -> None:
    error = SettingError("LOADER_X", "bad", "a thing", "LOADER_X: a message of its own")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.name, again.value, again.expected) == (
        SettingError, "LOADER_X: a message of its own", "LOADER_X", "bad", "a thing")


def test_internal_variables_are_named_once_and_kept_apart() -> None:
    user = {s.name for s in _settings.SETTINGS}
    internal = {s.name for s in _settings.INTERNAL}
    assert internal == {"LOADER_TP_LAUNCHED"}
    assert not user & internal
    assert len(user) == len(_settings.SETTINGS)
