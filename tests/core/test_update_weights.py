"""loader.update_weights on a small hand-built model: in place, partial, checked first, refused by name."""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pytest
import torch
from torch import nn

import loader
from loader.errors import PluginError, ShapeMismatchError, UnexpectedWeightError, UnsupportedError
from loader.layers import QuantizeMethodBase, default_weight_loader, set_param_layout
from loader.layers.param_layout import ParamLayout, weight_loader_of
from loader.weights import CheckpointTensor


class CountingMethod(QuantizeMethodBase):
    """A quantize method that takes updates (or refuses them) and counts its post-processing runs."""

    def __init__(self, refusal: str | None = None) -> None:
        self.refusal = refusal
        self.processed = 0

    def create_weights(self, layer: nn.Module, *args: object, **kwargs: object) -> None:
        layer.register_parameter("weight", nn.Parameter(torch.zeros(3, 2), requires_grad=False))

    def apply(self, layer: nn.Module, *args: object, **kwargs: object) -> torch.Tensor:
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        self.processed += 1

    def weight_update_refusal(self, layer: nn.Module) -> str | None:
        return self.refusal


class Layer(nn.Module):
    def __init__(self, method: QuantizeMethodBase) -> None:
        super().__init__()
        self.quant_method = method
        method.create_weights(self)


class Small(nn.Module):
    """``embed`` (4, 2), two quantized-method layers ``a`` and ``b``; checkpoint names end in ``.weight``."""

    def __init__(self, method_b: QuantizeMethodBase | None = None) -> None:
        super().__init__()
        self.embed = nn.Parameter(torch.zeros(4, 2), requires_grad=False)
        set_param_layout(self.embed, ParamLayout(weight_loader=default_weight_loader))
        self.a = Layer(CountingMethod())
        self.b = Layer(method_b or CountingMethod())

    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> set[str]:
        params = dict(self.named_parameters())
        done = set()
        for name, tensor in weights:
            key = name.removesuffix(".weight") if name == "embed.weight" else name
            if key not in params:
                raise UnexpectedWeightError(f"{tensor.describe()}: the Small model has no parameter for it")
            weight_loader_of(params[key])(params[key], tensor)
            done.add(key)
        return done


def _new() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    return {"embed.weight": torch.randn(4, 2), "a.weight": torch.randn(3, 2), "b.weight": torch.randn(3, 2)}


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in model.named_parameters()}


def _unchanged(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(param, before[name]) for name, param in model.named_parameters())


def test_an_update_writes_in_place_and_counts_a_version() -> None:
    model = Small()
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    new = _new()
    assert loader.weights_version(model) == 0
    report = loader.update_weights(model, new)
    assert torch.equal(model.embed, new["embed.weight"])
    assert torch.equal(model.a.weight, new["a.weight"])
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == pointers
    assert report.version == loader.weights_version(model) == 1
    assert report.tensors == 3
    assert report.parameters == ("a.weight", "b.weight", "embed")
    assert report.bytes == sum(t.numel() * 4 for t in new.values())
    assert loader.update_weights(model, new).version == 2


def test_a_partial_update_post_processes_only_the_layers_it_wrote() -> None:
    model = Small()
    report = loader.update_weights(model, {"a.weight": torch.ones(3, 2, dtype=torch.float64)})
    assert report.parameters == ("a.weight",)
    assert report.reprocessed == ("a",)
    assert model.a.quant_method.processed == 1
    assert model.b.quant_method.processed == 0
    assert model.a.weight.dtype == torch.float32 and bool((model.a.weight == 1).all())


def test_an_unknown_name_in_a_mapping_changes_nothing() -> None:
    model = Small()
    before = _snapshot(model)
    with pytest.raises(UnexpectedWeightError, match=r"tensor 'c.weight' of the update: the Small model has no "
                                                    r"parameter for it; nothing was written"):
        loader.update_weights(model, {**_new(), "c.weight": torch.zeros(1)})
    assert _unchanged(model, before)
    assert loader.weights_version(model) == 0


def test_strict_false_sets_unknown_names_aside() -> None:
    model = Small()
    report = loader.update_weights(model, {"c.weight": torch.zeros(1), **_new()}, strict=False)
    assert report.skipped == ("c.weight",)
    assert report.tensors == 3
    assert torch.equal(model.b.weight, _new()["b.weight"])


def test_strict_false_sets_unknown_names_aside_from_an_iterator_too() -> None:
    model = Small()
    report = loader.update_weights(model, iter([("c.weight", torch.zeros(1)), *_new().items()]), strict=False)
    assert report.skipped == ("c.weight",)
    assert report.tensors == 3


def test_a_wrong_shape_in_a_mapping_changes_nothing() -> None:
    model = Small()
    before = _snapshot(model)
    bad = {**_new(), "b.weight": torch.zeros(2, 3)}
    with pytest.raises(ShapeMismatchError, match=r"tensor 'b.weight' of the update: expected shape \(3, 2\), "
                                                 r"found \(2, 3\); nothing was written"):
        loader.update_weights(model, bad)
    assert _unchanged(model, before)


def test_a_one_pass_iterator_stops_at_the_bad_tensor_and_says_how_many_were_written() -> None:
    model = Small()
    new = _new()
    pairs = iter([("embed.weight", new["embed.weight"]), ("b.weight", torch.zeros(5)), ("a.weight", new["a.weight"])])
    with pytest.raises(ShapeMismatchError, match=r"expected shape \(3, 2\), found \(5,\); the update stopped "
                                                 r"there: 1 tensor\(s\) before it were written, and the weights "
                                                 r"version stays 0"):
        loader.update_weights(model, pairs)
    assert torch.equal(model.embed, new["embed.weight"])
    assert not model.a.weight.any()
    assert loader.weights_version(model) == 0


def test_integer_values_for_a_float_parameter_are_refused() -> None:
    with pytest.raises(UnsupportedError, match=r"tensor 'a.weight' of the update holds int64 values, which cannot "
                                               r"be written into a float32 parameter; give floating point values"):
        loader.update_weights(Small(), {"a.weight": torch.ones(3, 2, dtype=torch.int64)})


def test_a_value_that_is_not_a_tensor_is_refused() -> None:
    with pytest.raises(UnsupportedError, match=r"the value given for 'a.weight' is a list, not a torch.Tensor"):
        loader.update_weights(Small(), {"a.weight": [[1.0, 2.0]] * 3})


def test_a_name_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(UnsupportedError, match=r"takes \(name, tensor\) pairs; found a name 3, not a string"):
        loader.update_weights(Small(), iter([(3, torch.zeros(1))]))


def test_strict_must_be_a_bool() -> None:
    with pytest.raises(UnsupportedError, match=r"strict must be True or False, found 'yes'"):
        loader.update_weights(Small(), {}, strict="yes")  # type: ignore[arg-type]


def test_something_that_is_not_a_model_is_refused() -> None:
    with pytest.raises(UnsupportedError, match=r"expected a model returned by loader.load_model, found a dict"):
        loader.update_weights({}, {})  # type: ignore[arg-type]


def test_a_layer_whose_method_cannot_take_new_weights_is_refused_by_name_before_any_write() -> None:
    model = Small(CountingMethod(refusal="its blocks are packed for a kernel"))
    before = _snapshot(model)
    with pytest.raises(UnsupportedError, match=r"parameter 'b.weight' of layer 'b' cannot be updated in place: its "
                                               r"blocks are packed for a kernel; nothing was written"):
        loader.update_weights(model, _new())
    assert _unchanged(model, before)


def test_the_default_method_refuses_updates() -> None:
    class Plain(CountingMethod):
        weight_update_refusal = QuantizeMethodBase.weight_update_refusal  # type: ignore[assignment]

    with pytest.raises(UnsupportedError, match=r"layer 'b' cannot be updated in place: its quantize method Plain "
                                               r"does not take new weights in place"):
        loader.update_weights(Small(Plain()), {"b.weight": torch.zeros(3, 2)})


def test_a_loader_that_replaces_storage_is_reported() -> None:
    model = Small()

    def replacing(param: torch.Tensor, loaded: CheckpointTensor) -> None:
        param.data = loaded.read(param.dtype)

    set_param_layout(model.embed, ParamLayout(weight_loader=replacing))
    with pytest.raises(PluginError, match=r"replaced the storage of parameter\(s\) embed instead of writing"):
        loader.update_weights(model, {"embed.weight": torch.ones(4, 2)})


def test_the_weight_loaders_are_put_back() -> None:
    model = Small()
    original = weight_loader_of(model.embed)
    loader.update_weights(model, _new())
    assert weight_loader_of(model.embed) is original
    with pytest.raises(UnexpectedWeightError):
        loader.update_weights(model, {"x": torch.zeros(1)})
    assert weight_loader_of(model.embed) is original
    assert "_loader_layout" not in model.a.weight.__dict__


def test_an_update_started_from_inside_another_is_refused() -> None:
    model = Small()

    def nested() -> Iterable[tuple[str, torch.Tensor]]:
        loader.update_weights(model, {"a.weight": torch.zeros(3, 2)})
        yield "a.weight", torch.zeros(3, 2)

    with pytest.raises(UnsupportedError, match=r"Small is already being updated in this thread"):
        loader.update_weights(model, nested())


def test_concurrent_updates_of_one_model_run_one_after_the_other() -> None:
    model = Small()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def slow() -> Iterable[tuple[str, torch.Tensor]]:
        inside.set()
        release.wait(5)
        order.append("first")
        yield "a.weight", torch.ones(3, 2)

    def second() -> None:
        loader.update_weights(model, {"a.weight": torch.full((3, 2), 2.0)})
        order.append("second")

    first = threading.Thread(target=loader.update_weights, args=(model, slow()))
    first.start()
    inside.wait(5)
    other = threading.Thread(target=second)
    other.start()
    other.join(0.2)
    assert other.is_alive()  # waiting for the first update
    release.set()
    first.join(5)
    other.join(5)
    assert order == ["first", "second"]
    assert loader.weights_version(model) == 2
    assert bool((model.a.weight == 2).all())


def test_reload_needs_a_model_from_load_model() -> None:
    with pytest.raises(UnsupportedError, match=r"reload_weights needs a model returned by loader.load_model; this "
                                               r"Small does not say where it was loaded from"):
        loader.reload_weights(Small())
