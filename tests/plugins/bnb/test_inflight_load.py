"""``quantization="bitsandbytes"``: random Llama and Qwen2 checkpoints quantized while they load."""

from __future__ import annotations

import copy

import bitsandbytes.functional as F
import pytest
import torch

import loader
from loader_plugin_bnb.linear_method import BitsAndBytesLinearMethod
from tests.helpers.hf_checkpoints import reference_logits, relative_error, save_checkpoint, tiny_config
from tests.helpers.model_checks import random_ids

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("dense")
    return {family: (root / family, save_checkpoint(family, root / family)) for family in ("llama", "qwen2")}


def _quantized_layers(model):
    return {name: module for name, module in model.named_modules()
            if isinstance(getattr(module, "quant_method", None), BitsAndBytesLinearMethod)}


def _checkpoint_parts(reference, layer_name):
    """The checkpoint weights a layer holds at tp=1, in the order it stacks them."""
    state = reference.state_dict()
    parent, _, leaf = layer_name.rpartition(".")
    return [state[f"{parent}.{part}.weight"] for part in FUSED.get(leaf, (leaf,))]


def _with_weights(reference, dequantized):
    """A copy of the transformers model whose linear weights are the given (fused) ones, split back into parts."""
    model = copy.deepcopy(reference)
    state = model.state_dict()
    with torch.no_grad():
        for layer_name, weight in dequantized.items():
            parent, _, leaf = layer_name.rpartition(".")
            parts = FUSED.get(leaf, (leaf,))
            sizes = [state[f"{parent}.{p}.weight"].shape[0] for p in parts]
            for part, piece in zip(parts, weight.split(sizes), strict=True):
                state[f"{parent}.{part}.weight"].copy_(piece)
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize(("quant_type", "double_quant"), [("nf4", False), ("nf4", True), ("fp4", False),
                                                         ("fp4", True)])
def test_every_weight_is_bitsandbytes_quantized_and_logits_follow(checkpoints, family, quant_type, double_quant):
    path, reference = checkpoints[family]
    options = {"quant_type": quant_type, "double_quant": double_quant}
    model = loader.load_model(str(path), dtype="float32", quantization="bitsandbytes", quantization_options=options)
    layers = _quantized_layers(model)
    assert len(layers) == 4 * reference.config.num_hidden_layers  # qkv, o, gate_up, down

    dequantized = {}
    for name, layer in layers.items():
        # bitsandbytes quantizes (and double-quantizes) each checkpoint module on its own, as transformers does
        expected = torch.cat([F.dequantize_4bit(*F.quantize_4bit(part, blocksize=64, quant_type=quant_type,
                                                                 compress_statistics=double_quant))
                              for part in _checkpoint_parts(reference, name)])
        ours = F.dequantize_4bit(layer.weight, layer.quant_method.bnb_quant_state(layer))
        assert torch.equal(ours, expected), name
        dequantized[name] = layer.quant_method.dequantized_weight(layer)
        assert torch.equal(dequantized[name], expected), name

    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        actual = model(ids)
    expected_logits = reference_logits(_with_weights(reference, dequantized), ids)
    assert relative_error(actual, expected_logits) <= 1e-2
    # and 4-bit weights really changed the model: it is not the dense one
    assert relative_error(actual, reference_logits(reference, ids)) > 1e-3


def test_lm_head_and_embeddings_stay_dense(checkpoints):
    path, _ = checkpoints["llama"]
    model = loader.load_model(str(path), dtype="float32", quantization="bitsandbytes")
    assert model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32


def test_skipped_modules_stay_dense(checkpoints):
    path, reference = checkpoints["llama"]
    model = loader.load_model(str(path), dtype="float32", quantization="bitsandbytes",
                              quantization_options={"skip_modules": ["lm_head", "mlp.down_proj"]})
    down = model.model.layers[0].mlp.down_proj
    assert down.weight.dtype == torch.float32
    assert torch.equal(down.weight, reference.state_dict()["model.layers.0.mlp.down_proj.weight"])
    assert model.model.layers[0].self_attn.o_proj.weight.dtype == torch.uint8


def _linear_bytes(model) -> tuple[int, int]:
    """(bytes the quantized linear layers hold, bytes the same weights take in bfloat16)."""
    held = dense = 0
    for layer in _quantized_layers(model).values():
        held += sum(t.numel() * t.element_size() for t in (*layer.parameters(recurse=False),
                                                           *layer.buffers(recurse=False)))
        dense += layer.bnb_codes.rows * layer.bnb_codes.cols * 2
    return held, dense


@pytest.mark.parametrize(("double_quant", "ceiling"), [(False, 0.30), (True, 0.27)])
def test_quantized_linear_layers_take_under_30_percent_of_bfloat16(tmp_path, double_quant, ceiling):
    # big enough that per-layer constants (the 16- and 256-entry code tables) do not dominate
    config = tiny_config("llama", hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2)
    save_checkpoint("llama", tmp_path, config=config, dtype=torch.bfloat16)
    model, report = loader.load_model_with_report(
        str(tmp_path), dtype="bfloat16", quantization="bitsandbytes",
        quantization_options={"double_quant": double_quant})
    held, dense = _linear_bytes(model)
    share = held / dense
    print(f"bnb nf4 double_quant={double_quant}: linear layers hold {held} bytes, "
          f"{share:.1%} of {dense} bf16 bytes")
    assert share <= ceiling
    assert report.quantization["double_quant"] is double_quant


def test_full_precision_tensors_are_dropped_as_soon_as_they_are_quantized(checkpoints, monkeypatch):
    # peak memory stays near the quantized model plus one tensor: no dense slice outlives its own quantization
    import weakref

    import loader._hooks
    from loader.weights import CheckpointTensor

    alive: list[weakref.ref] = []
    most_alive = [0]

    class Tracking(CheckpointTensor):
        def __init__(self, base):
            self.base, self.name, self.file = base, base.name, base.file

        shape = property(lambda self: self.base.shape)
        dtype = property(lambda self: self.base.dtype)

        def narrow(self, dim, start, length):
            return Tracking(self.base.narrow(dim, start, length))

        def read(self, dtype=None):
            most_alive[0] = max(most_alive[0], sum(ref() is not None for ref in alive))
            values = self.base.read(dtype)
            alive.append(weakref.ref(values))
            return values

    original = loader._hooks.iter_weights
    monkeypatch.setattr(loader._hooks, "iter_weights", lambda *a, **k: (
        (name, Tracking(t) if name.endswith("proj.weight") else t) for name, t in original(*a, **k)))
    path, _ = checkpoints["llama"]
    loader.load_model(str(path), dtype="float32", quantization="bitsandbytes")
    assert len(alive) == 2 * 7  # every projection of both layers was read, once
    assert most_alive[0] == 0


def test_dummy_weights_load_quantized_and_give_finite_logits(checkpoints):
    path, reference = checkpoints["llama"]
    model = loader.load_model(str(path), dtype="float32", load_format="dummy", quantization="bitsandbytes")
    layer = model.model.layers[0].self_attn.qkv_proj
    assert layer.weight.dtype == torch.uint8
    assert float(layer.quant_method.dequantized_weight(layer).abs().max()) == pytest.approx(1e-3)
    with torch.no_grad():
        assert torch.isfinite(model(random_ids(reference.config.vocab_size))).all()
