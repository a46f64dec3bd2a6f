"""loader.update_weights on a GPTQ model: B's own GPTQ tensors are repacked into the layers' existing buffers.

The layers were repacked into kernel buffers at load; an update reopens the layers it names, lands B's
``qweight``/``qzeros``/``scales``/``g_idx`` through the same weight loaders as a load, converts them as a load
does and copies the result into the same buffers. Float tensors for a packed layer, and a layer given only some of
its tensors (or some parts of a fused one), are refused by name before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import loader
from loader.errors import UnsupportedError
from tests.helpers.awq_checkpoints import save_awq_checkpoint
from tests.helpers.compressed_tensors_checkpoints import save_ct_checkpoint
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.model_checks import random_ids

NOTHING_WRITTEN = r"; nothing was written \(the update was checked whole first\)$"


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


@pytest.fixture(scope="module")
def gptq(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("gptq-update")
    a, _ = save_gptq_checkpoint("llama", root / "A", bits=4, group_size=32, sym=True, seed=0)
    b, reference_b = save_gptq_checkpoint("llama", root / "B", bits=4, group_size=32, sym=True, seed=1)
    act_a, _ = save_gptq_checkpoint("qwen2", root / "act-A", bits=4, group_size=32, sym=False, desc_act=True, seed=0)
    act_b, _ = save_gptq_checkpoint("qwen2", root / "act-B", bits=4, group_size=32, sym=False, desc_act=True, seed=1)
    return {"a": a, "b": b, "tensors_b": _tensors(b), "float_b": reference_b.state_dict(), "act_a": act_a,
            "act_b": act_b}


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(random_ids(model.config.vocab_size))  # type: ignore[no-any-return]


def _storage(model: torch.nn.Module) -> dict[str, int]:
    return {name: t.data_ptr() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def test_an_update_with_b_gptq_tensors_equals_a_fresh_load_of_b(gptq) -> None:
    model = loader.load_model(str(gptq["a"]), dtype="float32")
    storage = _storage(model)
    report = loader.update_weights(model, gptq["tensors_b"])
    assert torch.equal(_logits(model), _logits(loader.load_model(str(gptq["b"]), dtype="float32")))
    assert _storage(model) == storage
    assert report.version == loader.weights_version(model) == 1
    assert "model.layers.0.self_attn.qkv_proj" in report.reprocessed
    assert "model.layers.1.mlp.down_proj" in report.reprocessed
    assert not any(name.endswith(("qweight", "qzeros", "scales", "g_idx")) for name, _ in model.named_parameters())


def test_act_order_checkpoints_update_and_reload_in_place(gptq) -> None:
    model = loader.load_model(str(gptq["act_a"]), dtype="float32")
    storage = _storage(model)
    loader.update_weights(model, iter(_tensors(gptq["act_b"]).items()))  # a one-pass iterator
    assert torch.equal(_logits(model), _logits(loader.load_model(str(gptq["act_b"]), dtype="float32")))
    loader.reload_weights(model)  # A again, from its folder
    assert torch.equal(_logits(model), _logits(loader.load_model(str(gptq["act_a"]), dtype="float32")))
    assert _storage(model) == storage
    assert loader.weights_version(model) == 2


def test_one_layer_given_whole_changes_that_layer_only(gptq) -> None:
    model = loader.load_model(str(gptq["a"]), dtype="float32")
    down = model.model.layers[0].mlp.down_proj
    others = {name: t.clone() for name, t in model.named_buffers() if ".mlp.down_proj." not in name}
    before = {name: t.clone() for name, t in down.named_buffers()}
    layer = {name: t for name, t in gptq["tensors_b"].items() if name.startswith("model.layers.0.mlp.down_proj.")}
    report = loader.update_weights(model, layer)
    assert report.reprocessed == ("model.layers.0.mlp.down_proj",)
    assert any(not torch.equal(t, before[name]) for name, t in down.named_buffers())
    assert all(torch.equal(t, others[name]) for name, t in model.named_buffers() if name in others)


def test_float_tensors_for_a_packed_layer_are_refused_by_name(gptq) -> None:
    model = loader.load_model(str(gptq["a"]), dtype="float32")
    before = _logits(model)
    with pytest.raises(UnsupportedError, match=(
            r"^tensor 'model.layers.0.self_attn.q_proj.weight' of the update is for layer "
            r"'model.layers.0.self_attn.qkv_proj', which its quantize method PackedLinearMethod keeps as qweight, "
            r"qzeros, scales, g_idx: give the layer tensors in that format \(as its checkpoint holds them\), not "
            rf"'weight'{NOTHING_WRITTEN}")):
        loader.update_weights(model, gptq["float_b"])
    assert torch.equal(_logits(model), before)
    assert loader.weights_version(model) == 0
    assert not any(name.endswith("qweight") for name, _ in model.named_parameters())


@pytest.mark.parametrize(("given", "message"), [
    (("model.layers.1.mlp.down_proj.qweight",),
     r"layer 'model.layers.1.mlp.down_proj' \(PackedLinearMethod\) was given qweight \(whole\) but not all of "
     r"qzeros, scales, g_idx: a packed layer is rebuilt from its whole tensor set \(qweight, qzeros, scales, "
     r"g_idx, every part of a fused layer\); give all of them or none"),
    (tuple(f"model.layers.0.self_attn.{part}_proj.{name}" for part in "qk" for name in
           ("qweight", "qzeros", "scales", "g_idx")),
     r"layer 'model.layers.0.self_attn.qkv_proj' \(PackedLinearMethod\) was given qweight \(parts k, q\), qzeros "
     r"\(parts k, q\), scales \(parts k, q\), g_idx \(parts k, q\) but not all of qweight, qzeros, scales, g_idx"),
])
def test_a_layer_given_part_of_its_set_is_refused_before_any_write(gptq, given, message) -> None:
    model = loader.load_model(str(gptq["a"]), dtype="float32")
    before = _logits(model)
    with pytest.raises(UnsupportedError, match=f"^{message}"):
        loader.update_weights(model, {name: gptq["tensors_b"][name] for name in given})
    assert torch.equal(_logits(model), before)
    assert loader.weights_version(model) == 0


def test_an_iterator_missing_part_of_a_set_keeps_that_layer_as_it_was(gptq) -> None:
    model = loader.load_model(str(gptq["a"]), dtype="float32")
    before = _logits(model)
    pairs = [(name, t) for name, t in gptq["tensors_b"].items() if name != "model.layers.1.mlp.down_proj.scales"]
    with pytest.raises(UnsupportedError, match=r"was given qweight \(whole\), qzeros \(whole\), g_idx \(whole\) but "
                                               r"not all of scales.*the weights version stays 0$"):
        loader.update_weights(model, iter(pairs))
    assert not torch.equal(_logits(model), before)  # the other layers took B's tensors
    assert loader.weights_version(model) == 0
    loader.update_weights(model, gptq["tensors_b"])  # the layer reopens cleanly
    assert torch.equal(_logits(model), _logits(loader.load_model(str(gptq["b"]), dtype="float32")))


@pytest.mark.parametrize("fmt", ["awq", "compressed-tensors-w8"])
def test_awq_and_compressed_tensors_checkpoints_update_in_place(tmp_path, fmt) -> None:
    if fmt == "awq":
        a, _ = save_awq_checkpoint("llama", tmp_path / "A", group_size=32, seed=0)
        b, _ = save_awq_checkpoint("llama", tmp_path / "B", group_size=32, seed=1)
    else:
        a, _ = save_ct_checkpoint("qwen2", tmp_path / "A", bits=8, group_size=32, sym=False, seed=0)
        b, _ = save_ct_checkpoint("qwen2", tmp_path / "B", bits=8, group_size=32, sym=False, seed=1)
    model = loader.load_model(str(a), dtype="float32")
    storage = _storage(model)
    loader.update_weights(model, _tensors(b))
    assert torch.equal(_logits(model), _logits(loader.load_model(str(b), dtype="float32")))
    assert _storage(model) == storage
