"""FP4 checkpoints (compressed-tensors NVFP4A16 / MXFP4A16 / NVFP4, ModelOpt NVFP4): logits, decoding, kernels,
refusals.

The reference (:mod:`tests.helpers.fp4_checkpoints`) is the ``transformers``
model holding the weights the format's definition gives (its inputs rounded to
NVFP4 for the W4A4 preset); the decoding is checked against bytes whose values
compressed-tensors 0.19 computed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loader._pipeline.load import load_model_with_report
from loader.errors import CheckpointFormatError, ShapeMismatchError, UnsupportedError
from loader.layers import QKVParallelLinear, RowParallelLinear
from loader.testing import simulated_tp
from loader_plugin_marlin.compressed_tensors_config import ct_config_from_checkpoint
from loader_plugin_marlin.fp4_activations import round_input_to_nvfp4, round_to_e2m1
from loader_plugin_marlin.fp4_config import fp4_scheme_from_ct
from loader_plugin_marlin.fp4_format import MXFP4, NVFP4, dequantize_fp4
from loader_plugin_marlin.fp4_kernels import cuda_fp4_choice, plan_fp4_kernel
from loader_plugin_marlin.fp4_method import DequantizedFp4Kernel
from loader_plugin_marlin.modelopt_config import modelopt_config_from_checkpoint
from tests.helpers.fp4_checkpoints import (
    LAYOUTS,
    ct_fp4_group,
    e2m1_codes,
    e2m1_values,
    fp4_quantization_config,
    save_fp4_checkpoint,
)
from tests.helpers.fp8_checkpoints import save_fp8_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids

TOLERANCE = 1e-3
LAYERS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")

# One row of 32 codes: bytes 0x21 0xF8 0x7A 0x05 0x93 0x6E 0xB4 0x0C, twice. compressed-tensors 0.19 decompresses
# it (NVFP4PackedCompressor / MXFP4PackedCompressor.decompress, bfloat16) to these values:
BYTES = torch.tensor([[0x21, 0xF8, 0x7A, 0x05, 0x93, 0x6E, 0xB4, 0x0C] * 2], dtype=torch.uint8)
CODES = [0.5, 1.0, -0.0, -6.0, -1.0, 6.0, 3.0, 0.0, 1.5, -0.5, -4.0, 4.0, 2.0, -1.5, -2.0, 0.0]
# NVFP4, weight_scale fp8 [[0.75, 13.0]], weight_global_scale [3.0]
NVFP4_LIBRARY = [0.125, 0.25, -0.0, -1.5, -0.25, 1.5, 0.75, 0.0, 0.375, -0.125, -1.0, 1.0, 0.5, -0.375, -0.5, 0.0,
                 2.171875, 4.34375, -0.0, -26.0, -4.34375, 26.0, 13.0, 0.0, 6.5, -2.171875, -17.375, 17.375, 8.6875,
                 -6.5, -8.6875, 0.0]
# MXFP4, weight_scale uint8 [[125]] (2 ** -2)
MXFP4_LIBRARY = [value / 4 for value in CODES] * 2


def load(path: Path, **kwargs):
    return load_model_with_report(str(path), dtype="float32", **kwargs)


def logits_error(model, reference) -> float:
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        return relative_error(model(ids), reference_logits(reference, ids))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_the_reference(tmp_path, layout, family):
    path, reference = save_fp4_checkpoint(family, tmp_path / "m", layout)
    model, report = load(path)
    assert logits_error(model, reference) <= TOLERANCE
    layers = report.quantization["layers"]
    assert set(layers) == {f"model.layers.{i}.{name}" for i in range(2) for name in LAYERS}
    assert {record["kernel"] for record in layers.values()} == {"dequantized"}
    assert "no FP4 matmul on cpu" in layers["model.layers.0.mlp.down_proj"]["reason"]


def test_fused_parts_keep_their_own_global_scales(tmp_path):
    """q, k and v were quantized with different global scales; one scale for all three would be ~1e-1 off."""
    path, reference = save_fp4_checkpoint("llama", tmp_path / "m", "ct-nvfp4")
    tensors = load_file(path / "model.safetensors")
    scales = {float(tensors[f"model.layers.0.self_attn.{p}_proj.weight_global_scale"]) for p in "qkv"}
    assert len(scales) == 3
    model, _ = load(path)
    assert logits_error(model, reference) <= TOLERANCE


def test_the_packer_decodes_bytes_as_compressed_tensors_does():
    codes = torch.stack((BYTES & 0x0F, BYTES >> 4), dim=-1).reshape(1, -1).long()
    assert e2m1_values(codes).tolist() == [CODES * 2]
    nv_scale = torch.tensor([0.75, 13.0]).repeat_interleave(16) / 3.0
    assert (e2m1_values(codes) * nv_scale).to(torch.bfloat16).float().tolist() == [NVFP4_LIBRARY]
    assert (e2m1_values(codes) * 2.0 ** (125 - 127)).tolist() == [MXFP4_LIBRARY]


def test_the_plugin_decodes_bytes_as_compressed_tensors_does():
    nv = {"weight_packed": BYTES, "weight_scale": torch.tensor([[0.75, 13.0]]).to(torch.float8_e4m3fn),
          "weight_global_scale": torch.tensor([3.0])}
    mx = {"weight_packed": BYTES, "weight_scale": torch.tensor([[125]], dtype=torch.uint8)}
    rows = torch.tensor([1])
    assert dequantize_fp4(NVFP4, nv, rows, torch.bfloat16).float().tolist() == [NVFP4_LIBRARY]
    assert dequantize_fp4(NVFP4, nv, rows, torch.float32).tolist() == [NVFP4_LIBRARY]
    assert dequantize_fp4(MXFP4, mx, rows, torch.float32).tolist() == [MXFP4_LIBRARY]


def _rewrite(path: Path, name: str, tensor: torch.Tensor) -> None:
    tensors = load_file(path / "model.safetensors")
    tensors[name] = tensor
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_a_scale_of_the_wrong_shape_is_refused(tmp_path):
    path, _ = save_fp4_checkpoint("llama", tmp_path / "m", "ct-nvfp4")
    name = "model.layers.0.self_attn.o_proj.weight_scale"
    _rewrite(path, name, torch.ones(64, 8).to(torch.float8_e4m3fn))
    with pytest.raises(ShapeMismatchError) as raised:
        load(path)
    assert str(raised.value) == (f"tensor {name!r} in {path / 'model.safetensors'}: expected shape (64, 4) for "
                                 "model.layers.0.self_attn.o_proj, found (64, 8)")


def test_packed_codes_of_another_dtype_are_refused(tmp_path):
    path, _ = save_fp4_checkpoint("llama", tmp_path / "m", "ct-mxfp4")
    name = "model.layers.0.mlp.down_proj.weight_packed"
    _rewrite(path, name, torch.zeros(64, 64, dtype=torch.int32))
    with pytest.raises(CheckpointFormatError) as raised:
        load(path)
    assert str(raised.value) == (f"tensor {name!r} in {path / 'model.safetensors'}: model.layers.0.mlp.down_proj."
                                 "weight_packed (E2M1 codes, two per byte) must be stored as uint8, found int32")


@pytest.mark.parametrize(("layout", "group", "fmt", "expected"), [
    ("ct-nvfp4", 32, "nvfp4-pack-quantized", "NVFP4) has groups of 16"),
    ("ct-mxfp4", 16, "mxfp4-pack-quantized", "MXFP4) has groups of 32"),
])
def test_another_group_size_is_refused(layout, group, fmt, expected):
    with pytest.raises(UnsupportedError) as raised:
        ct_config_from_checkpoint(fp4_quantization_config(layout, group))
    assert str(raised.value) == (f"config.json quantization_config config_groups.group_0.weights: group_size {group} "
                                 f"is not supported; {fmt} ({expected}")


def test_modelopt_group_size_other_than_16_is_refused():
    with pytest.raises(UnsupportedError) as raised:
        modelopt_config_from_checkpoint(fp4_quantization_config("modelopt-nvfp4", 32))
    assert str(raised.value) == ("config.json quantization_config: group_size 32 is not supported; ModelOpt NVFP4 "
                                 "has groups of 16")


def test_a_tensor_parallel_size_that_cuts_a_group_is_refused():
    """tp=4 gives each rank 16 of 64 input columns: half an MXFP4 group (NVFP4's 16 still fit)."""
    mx = fp4_scheme_from_ct("group_0", ct_fp4_group("ct-mxfp4"))
    nv = fp4_scheme_from_ct("group_0", ct_fp4_group("ct-nvfp4"))
    with simulated_tp(1, 4), torch.device("meta"):
        RowParallelLinear(64, 64, quant_config=nv, prefix="model.layers.0.mlp.down_proj")
        with pytest.raises(UnsupportedError) as raised:
            RowParallelLinear(64, 64, quant_config=mx, prefix="model.layers.0.mlp.down_proj")
    assert str(raised.value) == ("model.layers.0.mlp.down_proj: tensor parallel size 4 gives each rank 16 of 64 "
                                 "input columns, which cuts a group of 32 (MXFP4 scales one per group); the columns "
                                 "per rank must be a multiple of 32")


def test_other_activation_schemes_are_refused_by_name():
    """FP8 per-token activations beside NVFP4 weights (W4A8) are not a scheme whose rounding is reproduced."""
    fp8_tokens = {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": True, "symmetric": True}
    with pytest.raises(UnsupportedError) as raised:
        fp4_scheme_from_ct("group_0", {**ct_fp4_group("ct-nvfp4"), "input_activations": fp8_tokens})
    assert str(raised.value) == (
        "config.json quantization_config config_groups.group_0.input_activations: {'num_bits': 8, 'type': 'float', "
        "'strategy': 'token', 'group_size': None, 'dynamic': True, 'symmetric': True} with NVFP4 weights is not "
        "supported; FP4 activations load as the NVFP4 preset writes them: {'num_bits': 4, 'type': 'float', "
        "'strategy': 'tensor_group', 'group_size': 16, 'dynamic': 'local', 'symmetric': True}")


def test_activation_rounding_is_part_of_the_reference(tmp_path):
    """Without rounding the inputs the NVFP4 (W4A4) reference would be far from the loader: the emulation is
    tested, and it is recorded per layer."""
    path, reference = save_fp4_checkpoint("llama", tmp_path / "m", "ct-nvfp4-w4a4")
    model, report = load(path)
    assert report.quantization["groups"]["group_0"]["activations_applied"] is True
    assert report.quantization["layers"]["model.layers.0.mlp.down_proj"]["reason"].endswith(
        "; inputs rounded to NVFP4 per group of 16 as compressed-tensors' reference does")
    for module in reference.modules():
        module._forward_pre_hooks.clear()
    assert logits_error(model, reference) > 1e-2


def test_inputs_round_to_e2m1_as_compressed_tensors_does():
    """Ties go to the even mantissa; values from compressed-tensors 0.19's ``cast_to_fp4``."""
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.75, -0.1, 0.26, 0.74, 2.51, 9.0])
    expected = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -1.0, -0.0, 0.5, 0.5, 3.0, 6.0]
    assert round_to_e2m1(x).tolist() == expected
    assert e2m1_values(e2m1_codes(x)).tolist() == expected


def test_fused_parts_with_different_input_scales_round_their_own_inputs():
    weight = torch.randn(6, 32)
    scales = torch.tensor([50.0, 900.0])
    kernel = DequantizedFp4Kernel(weight, scales, (4, 2))
    x = torch.randn(3, 32)
    expected = torch.cat([round_input_to_nvfp4(x, scales[0]) @ weight[:4].T,
                          round_input_to_nvfp4(x, scales[1]) @ weight[4:].T], dim=-1)
    assert torch.equal(kernel.matmul(x), expected)
    assert not torch.equal(kernel.matmul(x)[:, 4:], round_input_to_nvfp4(x, scales[0]) @ weight[4:].T)


def test_another_modelopt_algorithm_is_refused_by_name():
    with pytest.raises(UnsupportedError) as raised:
        modelopt_config_from_checkpoint({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8_PB_WO"}})
    assert str(raised.value) == ("config.json quantization_config: ModelOpt quant_algo 'FP8_PB_WO' is not "
                                 "supported; expected one of ['NVFP4', 'W4A16_NVFP4', 'FP8']")


def test_modelopt_fp8_loads_with_the_fp8_method(tmp_path):
    """Per-tensor FP8 weights and a static input scale, scalars as ModelOpt stores them; the reference rounds
    the inputs to FP8 with that scale (vLLM's W8A8)."""
    path, reference = save_fp8_checkpoint("llama", tmp_path / "m", "ct-tensor-static")
    tensors = load_file(path / "model.safetensors")
    tensors = {name: value.reshape(()) if name.endswith(("weight_scale", "input_scale")) else value
               for name, value in tensors.items()}
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"],
                                     "kv_cache_scheme": None}
    (path / "config.json").write_text(json.dumps(config))
    model, report = load(path)
    assert report.quantization["method"] == "modelopt" and report.quantization["quant_algo"] == "FP8"
    assert report.quantization["kernels"] == {"fp8_dequantized": 8}
    assert logits_error(model, reference) <= TOLERANCE


def test_modelopt_nested_form_and_wildcard_excludes(tmp_path):
    """``hf_quant_config.json``'s nested form inside ``quantization_config``; an excluded layer stays dense."""
    config = modelopt_config_from_checkpoint({"quant_method": "modelopt", "quantization": {
        "quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head", "model.layers.1.mlp*"],
        "kv_cache_quant_algo": None}})
    assert config.ignores("model.layers.1.mlp.down_proj") and config.ignores("lm_head")
    assert not config.ignores("model.layers.0.mlp.down_proj")
    assert config.activations_quantized and config.scheme.input_name == "input_scale"


def test_layer_plan_from_shapes_equals_the_load_record(tmp_path):
    path, _ = save_fp4_checkpoint("llama", tmp_path / "m", "modelopt-nvfp4")
    _, report = load(path)
    config = modelopt_config_from_checkpoint(json.loads((path / "config.json").read_text())["quantization_config"])
    with torch.device("meta"):
        layer = QKVParallelLinear(64, 16, 4, 2, quant_config=config, prefix="model.layers.0.self_attn.qkv_proj")
    plan = layer.quant_method.layer_plan(layer)
    assert plan is not None
    assert plan.record() == report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]


@pytest.mark.parametrize(("capability", "activations", "kernel"), [
    ((12, 0), True, "cutlass_fp4"), ((10, 0), True, "cutlass_fp4"), ((10, 0), False, "marlin_fp4"),
    ((9, 0), True, "marlin_fp4"), ((8, 0), False, "marlin_fp4"), ((7, 5), False, "dequantized"),
])
def test_the_cuda_choice_follows_the_capability(capability, activations, kernel):
    assert cuda_fp4_choice(NVFP4, capability, activations_quantized=activations).kernel == kernel


def test_mxfp4_never_takes_the_fp4_activation_kernel():
    assert cuda_fp4_choice(MXFP4, (10, 0), activations_quantized=True).kernel == "marlin_fp4"


def test_the_cuda_record_names_what_vllm_would_run():
    choice = plan_fp4_kernel(NVFP4, "cuda", (9, 0), torch.bfloat16)
    assert choice.kernel == "dequantized"
    assert choice.reason == ("vLLM would use marlin_fp4 (NVFP4 weights, 16-bit activations (weight-only "
                             "checkpoint), compute capability 9.0 >= 8.0); this plugin has no FP4 GEMM, the weight "
                             "is decoded once at load into bfloat16")
