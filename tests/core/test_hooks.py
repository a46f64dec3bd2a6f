"""The typed hook wrappers: call order, argument subsets, plugin errors named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import loader
from loader import hooks
from loader.checkpoint import Source, WeightFormat
from loader.errors import LoadError, PluginError, SourceNotFoundError, UnsupportedError
from loader.options import LoadOptions
from loader.plugins import create_plugin_host
from loader.weights import EagerTensor, ReadStats

OPTIONS = LoadOptions(dtype=torch.float32, device=torch.device("cpu"))


def _host():  # type: ignore[no-untyped-def]
    return create_plugin_host(load_entry_points=False)


def test_firstresult_takes_the_first_answer_and_fewer_arguments(tmp_path: Path) -> None:
    class Declines:
        @loader.hookimpl
        def loader_detect_format(self, source):  # type: ignore[no-untyped-def]
            return None

    class Answers:
        @loader.hookimpl
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            return WeightFormat(name="fake", files=(str(source.path),))

    host = _host()
    host.register(Answers(), "answers")
    host.register(Declines(), "declines")
    fmt = hooks.detect_format(Source("x", tmp_path), "auto", host)
    assert fmt.name == "fake"


def test_no_format_plugin_says_so(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="no weight files any installed format plugin recognises"):
        hooks.detect_format(Source("x", tmp_path), "auto", _host())
    with pytest.raises(UnsupportedError, match="load_format 'nope' is not provided by any installed plugin"):
        hooks.detect_format(Source("x", tmp_path), "nope", _host())


def test_plugin_exception_names_plugin_and_hook(tmp_path: Path) -> None:
    class Boom:
        @loader.hookimpl
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            raise RuntimeError("kaput")

    host = _host()
    host.register(Boom(), "boom")
    with pytest.raises(PluginError, match=r"plugin 'boom' failed in loader_detect_format: RuntimeError: kaput"):
        hooks.detect_format(Source("x", tmp_path), "auto", host)


def test_load_error_from_a_plugin_passes_through(tmp_path: Path) -> None:
    class Strict:
        @loader.hookimpl
        def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
            raise LoadError("bad header in x.bin")

    host = _host()
    host.register(Strict(), "strict")
    with pytest.raises(LoadError, match="^bad header in x.bin$"):
        hooks.detect_format(Source("x", tmp_path), "auto", host)


def test_error_while_iterating_names_the_plugin(tmp_path: Path) -> None:
    class Stream:
        @loader.hookimpl
        def loader_iter_weights(self, weight_format):  # type: ignore[no-untyped-def]
            def gen():  # type: ignore[no-untyped-def]
                yield "a", EagerTensor(torch.zeros(1))
                raise ValueError("corrupt block")

            return gen()

    host = _host()
    host.register(Stream(), "stream")
    stream = hooks.iter_weights(Source("x", tmp_path), WeightFormat("fake", ()), OPTIONS, ReadStats(), host)
    assert next(stream)[0] == "a"
    with pytest.raises(PluginError, match="plugin 'stream' failed in loader_iter_weights: ValueError: corrupt block"):
        next(stream)


def test_register_architectures_tells_who_registered() -> None:
    class Models:
        @loader.hookimpl
        def loader_register_architectures(self, register):  # type: ignore[no-untyped-def]
            register("A", "pkg.mod:A")

    host = _host()
    host.register(Models(), "models")
    seen = []
    hooks.register_architectures(lambda plugin: (lambda arch, path: seen.append((plugin, arch, path))), host)
    assert seen == [("models", "A", "pkg.mod:A")]


def test_quantization_requested_without_plugin_is_refused() -> None:
    with pytest.raises(UnsupportedError, match="quantization 'bitsandbytes' is not provided by any installed plugin"):
        hooks.detect_quantization({}, "bitsandbytes", OPTIONS, _host())
    with pytest.raises(UnsupportedError, match="quant_method='gptq'"):
        hooks.detect_quantization({"quantization_config": {"quant_method": "gptq"}}, None, OPTIONS, _host())
    assert hooks.detect_quantization({}, None, OPTIONS, _host()) is None


def test_read_config_from_config_json(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["X"]}')
    cfg = hooks.read_config(Source("x", tmp_path), WeightFormat("fake", ()), _host())
    assert cfg["architectures"] == ["X"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", "config.json is not valid JSON"),
        (b"\xff\xfe", "config.json is not UTF-8"),
        (b"[1, 2]", "config.json must be a JSON object, found list"),
    ],
)
def test_bad_config_json_names_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(loader.ConfigError, match=message) as info:
        hooks.read_config(Source("x", tmp_path), WeightFormat("fake", ()), _host())
    assert str(tmp_path / "config.json") in str(info.value)


def test_missing_config_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(loader.ConfigError, match="no config.json"):
        hooks.read_config(Source("x", tmp_path), WeightFormat("fake", ()), _host())
