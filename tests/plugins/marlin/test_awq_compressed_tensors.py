"""AWQ and compressed-tensors pack-quantized checkpoints convert to the same representation and load."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.errors import CheckpointFormatError, ConfigError, FusedLayerSkipError, UnsupportedError
from loader.layers import LinearBase, UnquantizedLinearMethod
from loader_plugin_marlin.awq_format import AWQConfig, awq_config_from_checkpoint
from loader_plugin_marlin.compressed_tensors_config import ct_config_from_checkpoint
from loader_plugin_marlin.compressed_tensors_format import PackQuantizedConfig
from loader_plugin_marlin.layer_geometry import layer_geometry
from tests.helpers.awq_checkpoints import awq_quantization_config, pack_awq, save_awq_checkpoint
from tests.helpers.compressed_tensors_checkpoints import (
    ct_quantization_config,
    pack_compressed_tensors,
    save_ct_checkpoint,
)
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids


def _geometry(rows, cols, bits, group_size, act_order=False):
    return layer_geometry("layer", rows, [cols], rows, tp_rank=0, tp_size=1, bits=bits, group_size=group_size,
                          act_order=act_order, input_pack=True, output_pack=True)


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_awq_tensors_convert_to_the_packer_s_weight_exactly(group_size):
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(group_size))
    tensors, reference = pack_awq(weight, group_size)
    config = AWQConfig(bits=4, group_size=group_size, sym=False)
    converted = config.layout.to_quantized(tensors, _geometry(128, 48, 4, group_size))
    assert torch.equal(converted.dequantize(), reference)


@pytest.mark.parametrize(("bits", "group_size", "sym", "actorder"), [
    (4, 32, True, False), (4, 64, False, True), (8, -1, True, False), (8, 32, False, False), (4, -1, False, False)])
def test_compressed_tensors_convert_to_the_packer_s_weight_exactly(bits, group_size, sym, actorder):
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(bits))
    tensors, reference = pack_compressed_tensors(weight, bits, group_size, sym=sym, actorder=actorder,
                                                 scale_dtype=torch.float16)
    config = PackQuantizedConfig(bits=bits, group_size=group_size, sym=sym, act_order=actorder)
    converted = config.layout.to_quantized(tensors, _geometry(128, 64, bits, group_size, actorder))
    assert torch.equal(converted.dequantize(), reference)


CASES = {
    "awq-llama-g64": lambda root: save_awq_checkpoint("llama", root, group_size=64),
    "awq-qwen2-g32": lambda root: save_awq_checkpoint("qwen2", root, group_size=32),
    "ct-llama-sym-g32": lambda root: save_ct_checkpoint("llama", root, bits=4, group_size=32),
    "ct-qwen2-asym-actorder": lambda root: save_ct_checkpoint("qwen2", root, bits=4, group_size=32, sym=False,
                                                              actorder=True),
    "ct-llama-w8a16-channel": lambda root: save_ct_checkpoint("llama", root, bits=8, group_size=-1),
    "ct-llama-ignore-layer0-attention": lambda root: save_ct_checkpoint(
        "llama", root, ignore=("model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                               "model.layers.0.self_attn.v_proj")),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("awq-ct")
    return {case: make(root / case) for case, make in CASES.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_the_dequantized_reference_in_float32(checkpoints, case):
    path, reference = checkpoints[case]
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        error = relative_error(model(ids), reference_logits(reference, ids))
    assert error <= 1e-3, f"{case}: relative error {error:.3g}"
    assert report.quantization["method"] == ("awq" if case.startswith("awq") else "compressed-tensors")
    assert set(report.quantization["kernels"]) == {"int8pack" if "w8a16" in case else "int4pack"}


def test_an_ignore_list_in_checkpoint_names_keeps_the_fused_layer_dense(checkpoints):
    path, _ = checkpoints["ct-llama-ignore-layer0-attention"]
    model = loader.load_model(str(path), dtype="float32")
    methods = {name: type(m.quant_method) for name, m in model.named_modules() if isinstance(m, LinearBase)}
    assert methods["model.layers.0.self_attn.qkv_proj"] is UnquantizedLinearMethod
    assert methods["model.layers.1.self_attn.qkv_proj"] is not UnquantizedLinearMethod
    assert methods["model.layers.0.self_attn.o_proj"] is not UnquantizedLinearMethod
    config = ct_config_from_checkpoint(ct_quantization_config(4, 32, sym=True, actorder=False,
                                                              ignore=["re:.*layers\\.1\\.mlp\\.up_proj$"]))
    config.set_packed_modules({"gate_up_proj": ["gate_proj", "up_proj"]})
    assert config.ignores("model.layers.1.mlp.up_proj") and not config.ignores("model.layers.1.mlp.gate_proj")
    with pytest.raises(FusedLayerSkipError, match="compressed-tensors keeps .*up_proj.* unquantized but quantizes"):
        config.skip("model.layers.1.mlp.gate_up_proj")


def test_a_weight_shape_record_that_disagrees_with_the_layer_names_the_tensor(checkpoints, tmp_path):
    src, _ = checkpoints["ct-llama-sym-g32"]
    path = tmp_path / "bad-shape"
    shutil.copytree(src, path)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.1.self_attn.k_proj.weight_shape"] = torch.tensor([32, 48])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointFormatError, match=r"model.layers.1.self_attn.k_proj.weight_shape.*records an "
                       r"unpacked weight of shape \[32, 48\], but model.layers.1.self_attn.qkv_proj part 'k' has "
                       r"shape \[32, 64\]"):
        loader.load_model(str(path), dtype="float32")


@pytest.mark.parametrize(("fields", "error", "message"), [
    ({"bits": 8}, UnsupportedError, "AWQ bits 8 is not supported; AWQ checkpoints load with 4 bits"),
    ({"group_size": 48}, UnsupportedError, "AWQ group_size 48 is not one of"),
    ({"version": "gemv"}, UnsupportedError, "AWQ version 'gemv' is not supported; only 'gemm'"),
    ({"zero_point": False}, UnsupportedError, r"AWQ without zero points \(zero_point: false\) is not supported"),
])
def test_bad_awq_configs_are_named(fields, error, message):
    with pytest.raises(error, match=message):
        awq_config_from_checkpoint({**awq_quantization_config(128), **fields})


def _ct(**weights):
    declared = ct_quantization_config(4, 32, sym=True, actorder=False)
    declared["config_groups"]["group_0"]["weights"].update(weights)
    return declared


@pytest.mark.parametrize(("declared", "error", "message"), [
    (_ct(num_bits=2), UnsupportedError, "num_bits 2 is not supported; integer weights load with 4 or 8 bits"),
    (_ct(type="float"), UnsupportedError, "type 'float' is not supported; only 'int'"),
    (_ct(strategy="tensor", symmetric=False), UnsupportedError,
     "strategy 'tensor' with asymmetric weights is not supported; only symmetric"),
    (_ct(strategy="block"), UnsupportedError,
     "strategy 'block' is not supported; expected 'group', 'channel' or 'tensor'"),
    (_ct(group_size=None), ConfigError, "strategy 'group' needs a positive group_size, found None"),
    (_ct(actorder="dynamic"), UnsupportedError, "actorder 'dynamic' is not supported"),
    ({**_ct(), "format": "marlin-24"}, UnsupportedError,
     r"config_groups.group_0: compressed-tensors format 'marlin-24' is not supported; expected one of \[.*'dense'"),
    ({**_ct(), "config_groups": {}}, ConfigError, r"config_groups must name at least one scheme, found \{\}"),
])
def test_bad_compressed_tensors_configs_are_named(declared, error, message):
    with pytest.raises(error, match=message):
        ct_config_from_checkpoint(declared)


def test_activation_quantization_is_refused():
    declared = _ct()
    declared["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "int"}
    with pytest.raises(UnsupportedError, match="config_groups.group_0 quantizes activations; pack-quantized loads "
                                               r"weight-only \(W4A16/W8A16\) schemes"):
        ct_config_from_checkpoint(declared)
