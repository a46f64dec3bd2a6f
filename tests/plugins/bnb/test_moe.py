"""bitsandbytes and mixture-of-experts: experts stay as transformers writes them (dense), in-flight quantization
of experts is refused naming the layer, and a checkpoint with 4-bit experts is refused naming the tensor."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.errors import UnsupportedError
from loader.layers import FusedMoE, UnquantizedFusedMoEMethod
from loader_plugin_bnb.linear_method import BitsAndBytesLinearMethod
from tests.helpers.bnb_checkpoints import load_transformers_bnb, save_bnb_checkpoint
from tests.helpers.hf_checkpoints import relative_error
from tests.helpers.model_checks import random_ids, write_family_checkpoint


@pytest.fixture(scope="module")
def prequantized(tmp_path_factory):
    """transformers 5 quantizes the attention's ``nn.Linear``\\ s and writes the fused experts unquantized."""
    return save_bnb_checkpoint("qwen3_moe", tmp_path_factory.mktemp("bnb-moe"))


def test_a_transformers_checkpoint_loads_with_dense_experts_and_its_logits(prequantized):
    reference = load_transformers_bnb(prequantized)
    model = loader.load_model(str(prequantized), dtype="float32")
    experts = [m for m in model.modules() if isinstance(m, FusedMoE)]
    assert experts and all(isinstance(m.quant_method, UnquantizedFusedMoEMethod) for m in experts)
    assert isinstance(model.model.layers[0].self_attn.qkv_proj.quant_method, BitsAndBytesLinearMethod)
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(model(ids), reference(input_ids=ids, use_cache=False).logits) <= 2e-2


def test_in_flight_quantization_of_experts_is_refused_naming_the_layer(tmp_path):
    write_family_checkpoint("qwen3_moe", tmp_path)
    with pytest.raises(UnsupportedError, match=(
            r"^model\.layers\.0\.mlp\.experts: mixture-of-experts experts are not supported with bitsandbytes "
            r"in-flight quantization \(it quantizes linear layers only\); load without "
            r"quantization='bitsandbytes', or use a GPTQ or compressed-tensors checkpoint of the model$")):
        loader.load_model(str(tmp_path), dtype="float32", quantization="bitsandbytes")


def test_a_checkpoint_with_4bit_experts_is_refused_naming_the_tensor(prequantized, tmp_path):
    """transformers 4 quantized each expert's ``nn.Linear``: such a checkpoint's expert weights arrive packed."""
    path = shutil.copytree(prequantized, tmp_path / "packed-experts")
    tensors = load_file(path / "model.safetensors")
    source, target = "model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.experts.0.gate_proj.weight"
    for name in [n for n in tensors if n.startswith(source)]:
        tensors[target + name[len(source):]] = tensors[name].clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(UnsupportedError, match=(
            r"tensor 'model\.layers\.0\.mlp\.experts\.0\.gate_proj\.weight'.*: a bitsandbytes 4-bit expert weight; "
            r"mixture-of-experts experts are not supported with bitsandbytes")):
        loader.load_model(str(path), dtype="float32")
