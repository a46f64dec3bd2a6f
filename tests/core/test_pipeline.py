"""load_model end to end with an in-process format plugin and model: the pipeline's guarantees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import loader
from loader._plugins import create_plugin_host
from loader.checkpoint import WeightFormat
from loader.errors import (
    CheckpointFormatError,
    MissingWeightsError,
    UnexpectedWeightError,
    UnknownArchitectureError,
    UnsupportedError,
)
from loader.weights import EagerTensor

VOCAB, HIDDEN = 10, 4


class MemoryFormat:
    """Serves tensors from a dict; a folder holding ``memory.marker`` is this format."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]) -> None:
        self.tensors = tensors

    @loader.hookimpl
    def loader_detect_format(self, source, requested):  # type: ignore[no-untyped-def]
        marker = source.path / "memory.marker"
        if requested in ("auto", "memory") and marker.exists():
            return WeightFormat("memory", (str(marker),))
        return None

    @loader.hookimpl
    def loader_iter_weights(self, weight_format, stats):  # type: ignore[no-untyped-def]
        if weight_format.name != "memory":
            return None

        def gen():  # type: ignore[no-untyped-def]
            for name, t in self.tensors:
                stats.add(t.numel() * t.element_size())
                yield name, EagerTensor(t, name, "memory.marker")

        return gen()


class TinyModels:
    @loader.hookimpl
    def loader_register_architectures(self, register):  # type: ignore[no-untyped-def]
        register("TinyForCausalLM", "tests.core.fake_model:TinyForCausalLM")


def _checkpoint(tmp_path: Path, arch: str = "TinyForCausalLM") -> Path:
    (tmp_path / "memory.marker").write_text("")
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": [arch], "vocab_size": VOCAB, "hidden_size": HIDDEN}))
    return tmp_path


def _host(tensors: list[tuple[str, torch.Tensor]]):  # type: ignore[no-untyped-def]
    host = create_plugin_host(load_entry_points=False)
    host.register(MemoryFormat(tensors), "memory")
    host.register(TinyModels(), "tiny")
    return host


def _weights() -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(0)
    return [("embed.weight", torch.randn(VOCAB, HIDDEN)), ("head.weight", torch.randn(VOCAB, HIDDEN))]


def test_loads_values_and_reports(tmp_path: Path) -> None:
    weights = _weights()
    model, report = loader.load_model_with_report(str(_checkpoint(tmp_path)), dtype="float32", host=_host(weights))
    assert torch.equal(model.embed, weights[0][1])
    assert torch.equal(model.head, weights[1][1])
    assert not model.training
    assert report.architecture == "TinyForCausalLM"
    assert report.load_format == "memory"
    assert report.bytes_read == report.checkpoint_bytes == 2 * VOCAB * HIDDEN * 4
    assert report.parameter_bytes == 2 * VOCAB * HIDDEN * 4
    assert report.tensors == 2
    assert report.peak_rss_bytes > 0
    logits = model(torch.tensor([[1, 2, 3]]))
    assert logits.shape == (1, 3, VOCAB)


def test_target_dtype_conversion_is_exact(tmp_path: Path) -> None:
    weights = _weights()
    model = loader.load_model(str(_checkpoint(tmp_path)), dtype="bfloat16", host=_host(weights))
    assert model.embed.dtype == torch.bfloat16
    assert torch.equal(model.embed, weights[0][1].to(torch.bfloat16))


def test_missing_weight_names_the_parameter(tmp_path: Path) -> None:
    with pytest.raises(MissingWeightsError, match="no weights for parameter\\(s\\) head$"):
        loader.load_model(str(_checkpoint(tmp_path)), dtype="float32", host=_host(_weights()[:1]))


def test_duplicate_tensor_is_refused(tmp_path: Path) -> None:
    weights = _weights()
    with pytest.raises(CheckpointFormatError, match="tensor 'embed.weight' appears twice"):
        loader.load_model(str(_checkpoint(tmp_path)), dtype="float32", host=_host([*weights, weights[0]]))


def test_unexpected_weight_names_it(tmp_path: Path) -> None:
    weights = [*_weights(), ("extra.weight", torch.zeros(2))]
    with pytest.raises(UnexpectedWeightError, match="tensor 'extra.weight' in memory.marker"):
        loader.load_model(str(_checkpoint(tmp_path)), dtype="float32", host=_host(weights))


def test_unknown_architecture_lists_known(tmp_path: Path) -> None:
    with pytest.raises(UnknownArchitectureError, match="NopeForCausalLM") as info:
        loader.load_model(str(_checkpoint(tmp_path, "NopeForCausalLM")), host=_host(_weights()))
    assert "TinyForCausalLM" in str(info.value)


def test_dummy_format_fills_every_parameter(tmp_path: Path) -> None:
    model = loader.load_model(str(_checkpoint(tmp_path)), dtype="float32", load_format="dummy",
                              host=_host([]))
    assert model.embed.abs().max() <= 1e-3
    assert model.embed.abs().sum() > 0


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="dtype 'int7' is not supported"):
        loader.load_model(str(_checkpoint(tmp_path)), dtype="int7", host=_host([]))
    with pytest.raises(UnsupportedError, match="device 'tpu' is not supported"):
        loader.load_model(str(_checkpoint(tmp_path)), device="tpu", host=_host([]))
    with pytest.raises(loader.SourceNotFoundError, match="/no/such/dir"):
        loader.load_model("/no/such/dir", host=_host([]))


def test_failed_load_returns_nothing_and_frees_memory(tmp_path: Path) -> None:
    import gc
    import weakref

    created: list[weakref.ref] = []
    from tests.core import fake_model

    original = fake_model.TinyForCausalLM.__init__

    def tracking_init(self, ctx):  # type: ignore[no-untyped-def]
        original(self, ctx)
        created.append(weakref.ref(self))

    fake_model.TinyForCausalLM.__init__ = tracking_init  # type: ignore[method-assign]
    try:
        with pytest.raises(MissingWeightsError):
            loader.load_model(str(_checkpoint(tmp_path)), dtype="float32", host=_host(_weights()[:1]))
    finally:
        fake_model.TinyForCausalLM.__init__ = original  # type: ignore[method-assign]
    gc.collect()
    assert created and all(ref() is None for ref in created)


def test_absurd_sizes_are_refused_before_allocating(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path)
    (folder / "config.json").write_text(json.dumps(
        {"architectures": ["TinyForCausalLM"], "vocab_size": 10**9, "hidden_size": 10**5}))
    needs = r"TinyForCausalLM\): the model needs 800000.00 GB for its parameters on cpu"
    with pytest.raises(UnsupportedError, match=needs):
        loader.load_model(str(folder), dtype="float32", host=_host([]))


class _StringLocations:
    """A source plugin that, as the hook's contract says, is handed the location as a ``str``."""

    seen: list[object]

    def __init__(self) -> None:
        self.seen = []

    @loader.hookimpl
    def loader_resolve_source(self, location: object, options: object) -> None:
        self.seen.append(location)
        assert isinstance(location, str), location
        return None


def test_a_path_object_loads_as_its_string(tmp_path: Path) -> None:
    """``load_model(Path(...))`` works as ``from_pretrained(Path(...))`` does: plugins still get a ``str`` (a
    ``Path`` once reached the tensorizer plugin's ``location.rstrip`` and failed the load as its bug)."""
    host = _host(_weights())
    strings = _StringLocations()
    host.register(strings, "strings")
    by_path = loader.load_model(_checkpoint(tmp_path), dtype="float32", host=host)
    by_str = loader.load_model(str(tmp_path), dtype="float32", host=host)
    assert strings.seen == [str(tmp_path), str(tmp_path)]
    for (name, got), (_, expected) in zip(by_path.state_dict().items(), by_str.state_dict().items(), strict=True):
        assert torch.equal(got, expected), name


@pytest.mark.parametrize("source", [42, None, b"/tmp/model"])
def test_a_source_that_is_no_path_or_string_is_refused(source: object) -> None:
    with pytest.raises(UnsupportedError, match=r"^source must be a path or a string \(a folder, a file, a Hub id "
                                                r"or a URI\), found (int|NoneType|bytes)"):
        loader.load_model(source, host=_host([]))  # type: ignore[arg-type]
