"""The GGUF plugin's environment variables, declared through loader.settings: a bad value is the core's
SettingError, raised by the code that reads it, with the message a user sees."""

from __future__ import annotations

import pytest
import torch

from loader.checkpoint import LoadOptions
from loader.errors import SettingError
from loader_plugin_gguf import settings
from loader_plugin_gguf.packed.bundle_keys import DEFAULT_MAX_BYTES, cache_requested

BAD = {
    "LOADER_GGUF_PACKED_CACHE": ("sometimes", "a yes/no value (1, true, yes, on / 0, false, no, off)"),
    "LOADER_GGUF_CACHE_MAX_BYTES": ("8GiB", "a whole number of bytes (at least 0)"),
}


def _options() -> LoadOptions:
    return LoadOptions(dtype=torch.float32, device=torch.device("cpu"))


def test_every_declared_variable_has_a_bad_value_case() -> None:
    assert {s.name for s in settings.SETTINGS} == set(BAD)


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_a_setting_error_naming_variable_value_and_what_is_expected(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    value, expected = BAD[name]
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "1")  # the size is read when the bundle is on
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError) as info:
        cache_requested(_options())
    assert str(info.value) == f"{name}={value!r}: expected {expected}"


def test_the_format_option_wins_so_the_variable_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", "sometimes")
    options = LoadOptions(dtype=torch.float32, device=torch.device("cpu"), format_options={"packed_cache": False})
    assert cache_requested(options) is False


@pytest.mark.parametrize(("value", "on"), [("0", False), ("off", False), ("1", True), (" YES ", True), ("", True)])
def test_yes_no_values(value: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADER_GGUF_PACKED_CACHE", value)
    monkeypatch.delenv("LOADER_GGUF_CACHE_MAX_BYTES", raising=False)
    assert cache_requested(_options()) is on


def test_the_size_defaults_to_8_gib() -> None:
    assert settings.CACHE_MAX_BYTES.read({}) == DEFAULT_MAX_BYTES == 8 << 30
    assert settings.CACHE_MAX_BYTES.read({"LOADER_GGUF_CACHE_MAX_BYTES": "0"}) == 0
