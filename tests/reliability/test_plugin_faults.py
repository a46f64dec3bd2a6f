"""A plugin that raises inside a hook: ``PluginError`` naming plugin and hook, nothing half-loaded.

Each test builds a fresh host with the installed plugins, registers one
in-process plugin that fails in one hook (pluggy calls the newest plugin
first), and loads a valid tiny Llama through ``loader.load_model``. After the
failure the same host, without the faulty plugin, still loads the checkpoint.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import loader
from loader._cli.main import main
from loader._plugins import PluginHost, create_plugin_host, use_plugin_host
from loader.checkpoint import WeightFormat
from loader.errors import PluginError
from loader.layers.quantization import QuantizationConfig
from loader.weights import EagerTensor
from tests.helpers.malformed import llama_tensors, write_llama_checkpoint

HOOKS = [
    "loader_resolve_source",
    "loader_detect_format",
    "loader_read_config",
    "loader_iter_weights",
    "loader_detect_quantization",
    "loader_register_architectures",
    "loader_process_weights_after_loading",
]


def raising_plugin(hook: str, exc: Exception) -> object:
    """A plugin implementing only ``hook``, which raises ``exc``."""

    def impl() -> None:
        raise exc

    plugin = types.SimpleNamespace()
    setattr(plugin, hook, loader.hookimpl(impl))
    return plugin


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    write_llama_checkpoint(tmp_path / "model")
    return tmp_path / "model"


def _still_loads(host: PluginHost, checkpoint: Path, faulty: str) -> None:
    host.unregister(faulty)
    model = loader.load_model(str(checkpoint), dtype="float32", host=host)
    assert model.config.num_hidden_layers == 2


@pytest.mark.parametrize("hook", HOOKS)
def test_plugin_raising_in_a_hook_is_named(hook: str, checkpoint: Path) -> None:
    host = create_plugin_host()
    host.register(raising_plugin(hook, ZeroDivisionError("division by zero in a plugin")), "faulty")
    with pytest.raises(PluginError) as info:
        loader.load_model(str(checkpoint), dtype="float32", host=host)
    assert str(info.value) == (
        f"plugin 'faulty' failed in {hook}: ZeroDivisionError: division by zero in a plugin"
    )
    _still_loads(host, checkpoint, "faulty")


class _StreamFailsMidway:
    """Claims the folder as format ``midway`` and fails after yielding three tensors."""

    def __init__(self) -> None:
        self.yielded = 0

    @loader.hookimpl
    def loader_detect_format(self, source: Any, requested: str) -> WeightFormat | None:
        return WeightFormat("midway", (str(source.path),)) if requested in ("auto", "midway") else None

    @loader.hookimpl
    def loader_iter_weights(self, weight_format: WeightFormat) -> Iterator[tuple[str, EagerTensor]] | None:
        if weight_format.name != "midway":
            return None

        def stream() -> Iterator[tuple[str, EagerTensor]]:
            for name, tensor in llama_tensors().items():
                if self.yielded == 3:
                    raise OSError(5, "Input/output error")
                self.yielded += 1
                yield name, EagerTensor(tensor, name, "midway")

        return stream()


def test_format_plugin_failing_mid_stream_is_named(checkpoint: Path) -> None:
    host = create_plugin_host()
    plugin = _StreamFailsMidway()
    host.register(plugin, "midway")
    with pytest.raises(PluginError, match=r"^plugin 'midway' failed in loader_iter_weights: OSError: "
                                          r"\[Errno 5\] Input/output error$"):
        loader.load_model(str(checkpoint), dtype="float32", host=host)
    assert plugin.yielded == 3, "the failure came mid-stream, after some parameters were filled"
    _still_loads(host, checkpoint, "midway")


class _OwnQuantization(QuantizationConfig):
    name = "faulty-quant"

    def get_quant_method(self, layer: Any, prefix: str) -> None:
        raise KeyError(prefix)


class _QuantMethodFails:
    @loader.hookimpl
    def loader_detect_quantization(self, requested: str | None) -> QuantizationConfig | None:
        return _OwnQuantization() if requested == "faulty-quant" else None


def test_quantization_config_failing_in_get_quant_method_is_named(checkpoint: Path) -> None:
    """The first layer that asks (the token embedding, which asks since embeddings may be quantized) is named."""
    host = create_plugin_host()
    host.register(_QuantMethodFails(), "faulty-quant")
    with pytest.raises(PluginError, match=r"^quantization 'faulty-quant' failed in get_quant_method: "
                                          r"KeyError: 'model\.embed_tokens'$"):
        loader.load_model(str(checkpoint), dtype="float32", quantization="faulty-quant", host=host)


class _GroupingFails(QuantizationConfig):
    name = "faulty-grouping"

    def wrap_weights(self, weights: Any) -> Iterator[tuple[str, Any]]:
        for index, item in enumerate(weights):
            if index == 2:
                raise RecursionError("maximum recursion depth exceeded while decoding a JSON array")
            yield item


class _WrapWeightsFails:
    @loader.hookimpl
    def loader_detect_quantization(self, requested: str | None) -> QuantizationConfig | None:
        return _GroupingFails() if requested == "faulty-grouping" else None


def test_quantization_failing_in_wrap_weights_is_named_not_blamed_on_the_model(checkpoint: Path) -> None:
    host = create_plugin_host()
    host.register(_WrapWeightsFails(), "faulty-grouping")
    with pytest.raises(PluginError, match=r"^quantization 'faulty-grouping' failed in wrap_weights: "
                                          r"RecursionError: maximum recursion depth exceeded"):
        loader.load_model(str(checkpoint), dtype="float32", quantization="faulty-grouping", host=host)


class _FaultyModels:
    @loader.hookimpl
    def loader_register_architectures(self, register: Any) -> None:
        register("FailsWhileBuiltForCausalLM", "tests.reliability.faulty_models:FailsWhileBuilt")
        register("FailsInLoadWeightsForCausalLM", "tests.reliability.faulty_models:FailsInLoadWeights")
        register("MissingModuleForCausalLM", "tests.reliability.no_such_module:Model")


def _with_architecture(checkpoint: Path, arch: str) -> Path:
    import json

    config_path = checkpoint / "config.json"
    config = json.loads(config_path.read_text())
    config["architectures"] = [arch]
    config_path.write_text(json.dumps(config))
    return checkpoint


@pytest.mark.parametrize(("arch", "expected"), [
    ("FailsWhileBuiltForCausalLM", "model class for FailsWhileBuiltForCausalLM failed while being built: "
                                   "RuntimeError: layer 7 has no attribute 'mlp' (model plugin bug)"),
    ("FailsInLoadWeightsForCausalLM", "model class for FailsInLoadWeightsForCausalLM failed in load_weights: "
                                      "IndexError: list index out of range (model plugin bug)"),
    ("MissingModuleForCausalLM", "tests.reliability.no_such_module"),
])
def test_model_class_bugs_name_the_architecture(checkpoint: Path, arch: str, expected: str) -> None:
    host = create_plugin_host()
    host.register(_FaultyModels(), "faulty-models")
    with pytest.raises(PluginError) as info:
        loader.load_model(str(_with_architecture(checkpoint, arch)), dtype="float32", host=host)
    assert expected in str(info.value)


@pytest.mark.parametrize("arch", ["FailsWhileBuiltForCausalLM", "FailsInLoadWeightsForCausalLM"])
def test_cli_reports_a_plugin_bug_on_one_line(checkpoint: Path, arch: str, capsys) -> None:
    host = create_plugin_host()
    host.register(_FaultyModels(), "faulty-models")
    with use_plugin_host(host):
        code = main(["load", str(_with_architecture(checkpoint, arch))])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"error: model class for {arch} failed") and err.count("\n") == 1
    assert "Traceback" not in err
