"""Checkpoints ``transformers`` wrote with bitsandbytes 4-bit load as they are, at tp=1 and sliced for tp=2."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader._distributed import simulated_tp
from loader.errors import CheckpointFormatError, UnsupportedError
from loader_plugin_bnb.linear_method import BitsAndBytesLinearMethod
from tests.helpers.bnb_checkpoints import dequantized_linear_weights, load_transformers_bnb, save_bnb_checkpoint
from tests.helpers.hf_checkpoints import relative_error
from tests.helpers.model_checks import random_ids
from tests.plugins.bnb.test_inflight_load import FUSED

# hidden 128: every tp=2 slice of every weight is whole 64-value blocks
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "llama-nf4-double": ("llama", "nf4", True, ALIGNED),
    "qwen2-fp4": ("qwen2", "fp4", False, ALIGNED),
    "llama-small": ("llama", "nf4", True, {}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("bnb")
    paths = {}
    for case, (family, quant_type, double_quant, overrides) in CASES.items():
        paths[case] = save_bnb_checkpoint(family, root / case, quant_type=quant_type, double_quant=double_quant,
                                          **overrides)
    return paths


def _fused_reference(dequantized, layer_name):
    parent, _, leaf = layer_name.rpartition(".")
    return torch.cat([dequantized[f"{parent}.{part}.weight"] for part in FUSED.get(leaf, (leaf,))])


def _layers(model):
    return {name: m for name, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), BitsAndBytesLinearMethod)}


@pytest.mark.parametrize("case", ["llama-nf4-double", "qwen2-fp4"])
def test_weights_are_exactly_transformers_and_logits_match(checkpoints, case):
    reference = load_transformers_bnb(checkpoints[case])
    dequantized = dequantized_linear_weights(reference)  # before any forward repacks them
    model, report = loader.load_model_with_report(str(checkpoints[case]), dtype="float32")
    assert report.quantization["prequantized"] is True
    layers = _layers(model)
    assert len(layers) == 4 * reference.config.num_hidden_layers
    for name, layer in layers.items():
        assert torch.equal(layer.quant_method.dequantized_weight(layer), _fused_reference(dequantized, name)), name
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        error = relative_error(model(ids), reference(input_ids=ids, use_cache=False).logits)
    assert error <= 2e-2


def test_each_tp_rank_holds_whole_blocks_of_the_same_weights(checkpoints):
    path = checkpoints["llama-nf4-double"]
    single = loader.load_model(str(path), dtype="float32")
    full = {n: m.quant_method.dequantized_weight(m) for n, m in _layers(single).items()}
    shards = []
    for rank in range(2):
        with simulated_tp(rank, 2):
            model = loader.load_model(str(path), dtype="float32")
        shards.append({n: m.quant_method.dequantized_weight(m) for n, m in _layers(model).items()})
    for name, weight in full.items():
        if name.endswith(("o_proj", "down_proj")):  # row parallel: input columns split
            assert torch.equal(torch.cat([s[name] for s in shards], dim=1), weight), name
            continue
        leaf = name.rpartition(".")[2]
        parts = 3 if leaf == "qkv_proj" else 2
        sizes = [4 * 32, 2 * 32, 2 * 32] if parts == 3 else [256, 256]
        per_rank = [torch.split(s[name], [size // 2 for size in sizes]) for s in shards]
        stitched = torch.cat([torch.cat([pr[i] for pr in per_rank]) for i in range(parts)])
        assert torch.equal(stitched, weight), name


def test_tp_that_splits_quantization_blocks_names_shape_blocksize_and_tp(checkpoints):
    with simulated_tp(1, 2), pytest.raises(UnsupportedError) as info:
        loader.load_model(str(checkpoints["llama-small"]), dtype="float32")
    message = str(info.value)
    assert "cannot split the pre-quantized weight of shape (64, 64) (blocksize 64) over tensor parallel size 2" \
        in message
    assert "model.layers.0.self_attn.o_proj" in message


def _edited_copy(source, target, edit):
    shutil.copytree(source, target)
    (file,) = target.glob("*.safetensors")
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file), metadata={"format": "pt"})
    return target


NAME = "model.layers.1.self_attn.k_proj.weight"


def test_a_checkpoint_missing_an_absmax_names_the_tensor(checkpoints, tmp_path):
    path = _edited_copy(checkpoints["llama-small"], tmp_path / "c", lambda t: t.pop(f"{NAME}.absmax"))
    with pytest.raises(CheckpointFormatError, match=rf"tensor {NAME!r} in .*model.safetensors: packed 4-bit "
                                                    rf"weight {NAME!r} has no '{NAME}.absmax'"):
        loader.load_model(str(path), dtype="float32")


def test_a_corrupt_quant_state_names_the_tensor(checkpoints, tmp_path):
    state = f"{NAME}.quant_state.bitsandbytes__nf4"

    def corrupt(tensors):
        tensors[state] = tensors[state][:-5].clone()

    path = _edited_copy(checkpoints["llama-small"], tmp_path / "c", corrupt)
    with pytest.raises(CheckpointFormatError, match=rf"tensor {state!r} in .*: quant_state is not valid UTF-8 JSON"):
        loader.load_model(str(path), dtype="float32")


def test_a_packed_weight_of_the_wrong_size_names_the_tensor(checkpoints, tmp_path):
    path = _edited_copy(checkpoints["llama-small"], tmp_path / "c",
                        lambda t: t.__setitem__(NAME, t[NAME][:-8].clone()))
    with pytest.raises(CheckpointFormatError, match=rf"tensor {NAME!r} in .*: packed data of a nf4 weight of shape "
                                                    r"\(32, 64\) with blocksize 64 must be 1024 uint8 values"):
        loader.load_model(str(path), dtype="float32")


def test_a_dense_weight_among_packed_ones_is_refused(checkpoints, tmp_path):
    def densify(tensors):
        for key in [k for k in tensors if k.startswith(f"{NAME}.")]:
            del tensors[key]
        tensors[NAME] = torch.zeros(32, 64)

    path = _edited_copy(checkpoints["llama-small"], tmp_path / "c", densify)
    with pytest.raises(CheckpointFormatError, match="qkv_proj expects a bitsandbytes 4-bit weight"):
        loader.load_model(str(path), dtype="float32")
