"""compressed-tensors int8 groups (W8A8, W8A16) through ``int8_scheme_from_ct``: logits, kernels, refusals.

The config is built from one ``config_groups`` entry by :func:`int8_scheme_from_ct` and handed to the load by
an in-process plugin (the compressed-tensors dispatcher that will call it is written separately), so every
layer of the tiny models is an int8 layer of that group. Reference: the ``transformers`` model holding the
dequantized weights, for W8A8 schemes with its linears' inputs fake-quantized as compressed-tensors' forward
does (what llm-compressor evaluates and transformers 5.17 computes; every kernel takes the rounded input).
"""

from __future__ import annotations

import pytest
import torch

import loader
from loader._pipeline.plan import plan_layers
from loader.errors import CheckpointFormatError, ShapeMismatchError, UnsupportedError
from loader.kernels import KernelChoice
from loader_plugin_marlin.int8_config import int8_scheme_from_ct
from loader_plugin_marlin.int8_kernels import plan_int8_kernel, wanted_int8_kernel
from loader_plugin_marlin.int8_method import Int8LayerState, Int8LinearMethod
from loader_plugin_marlin.int8_scheme import Int8Activations
from loader_plugin_marlin.kernels import choose_kernel
from loader_plugin_marlin.quantized_weight import QuantizedWeight, default_g_idx
from tests.helpers.compressed_tensors_checkpoints import save_ct_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.int8_checkpoints import METHOD, fake_quantize_inputs, int8_host, int8_scheme, save_int8_checkpoint
from tests.helpers.model_checks import random_ids

SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def _load(path, dtype="float32", options=None):
    return loader.load_model_with_report(str(path), dtype=dtype, quantization=METHOD, quantization_options=options,
                                         host=int8_host())


def _logits(model, ids):
    with torch.no_grad():
        return model(ids)


CASES = {
    "llama-channel-token": ("llama", int8_scheme("channel")),
    "llama-tensor-static": ("llama", int8_scheme("tensor", activations="tensor")),
    "qwen2-channel-asym-token-asym": ("qwen2", int8_scheme("channel", symmetric=False, activation_symmetric=False)),
    "qwen2-tensor-asym-static-asym": ("qwen2", int8_scheme("tensor", symmetric=False, activations="tensor",
                                                           activation_symmetric=False)),
    "llama-group32-weight-only": ("llama", int8_scheme("group", activations=None)),
}


def _expected(reference, scheme, ids):
    """The reference's logits, its linears' inputs rounded as compressed-tensors' forward rounds W8A8 ones."""
    if scheme["input_activations"] is not None:
        reference = fake_quantize_inputs(reference, scheme["input_activations"])
    return reference_logits(reference, ids)


@pytest.mark.parametrize("case", sorted(CASES))
def test_float32_logits_match_the_dequantized_reference(tmp_path, case):
    family, scheme = CASES[case]
    path, reference = save_int8_checkpoint(family, tmp_path / case, scheme, **SIZES)
    model, report = _load(path)
    ids = random_ids(reference.config.vocab_size)
    assert relative_error(_logits(model, ids), _expected(reference, scheme, ids)) <= 1e-3
    layers = report.quantization["layers"]
    assert layers["model.layers.0.self_attn.qkv_proj"] == {"kernel": "dequantized", "reason": None}
    assert set(report.quantization["kernels"]) == {"dequantized"}


W8A8_CASES = {
    "llama-channel-token": ("llama", int8_scheme("channel")),
    "qwen2-tensor-static": ("qwen2", int8_scheme("tensor", activations="tensor")),
    "llama-channel-static-asym": ("llama", int8_scheme("channel", activations="tensor", activation_symmetric=False)),
    "qwen2-channel-token-asym": ("qwen2", int8_scheme("channel", activation_symmetric=False)),
}


@pytest.mark.parametrize("case", sorted(W8A8_CASES))
def test_int8_mm_matches_the_fake_quantized_reference(tmp_path, case):
    """``kernel="int8_mm"``: int8 activations times int8 weights, what compressed-tensors' forward computes."""
    family, scheme = W8A8_CASES[case]
    path, reference = save_int8_checkpoint(family, tmp_path / case, scheme, **SIZES)
    model, report = _load(path, options={"kernel": "int8_mm"})
    ids = random_ids(reference.config.vocab_size)
    expected = reference_logits(fake_quantize_inputs(reference, scheme["input_activations"]), ids)
    assert relative_error(_logits(model, ids), expected) <= 1e-3
    assert set(report.quantization["kernels"]) == {"int8_mm"}


def test_bfloat16_loads_record_int8_mm_for_w8a8_int8pack_for_w8a16_rows_and_int8planes_for_groups(tmp_path):
    channel, _ = save_int8_checkpoint("llama", tmp_path / "channel", int8_scheme("channel"), **SIZES)
    w8a16, _ = save_int8_checkpoint("llama", tmp_path / "w8a16", int8_scheme("channel", activations=None), **SIZES)
    grouped, _ = save_int8_checkpoint("llama", tmp_path / "group", int8_scheme("group", activations=None), **SIZES)
    assert set(_load(channel, "bfloat16")[1].quantization["kernels"]) == {"int8_mm"}
    assert set(_load(w8a16, "bfloat16")[1].quantization["kernels"]) == {"int8pack"}
    _, report = _load(grouped, "bfloat16")
    assert report.quantization["layers"]["model.layers.1.mlp.down_proj"] == {
        "kernel": "int8planes", "reason": None, "paths_from": "static",
        "by_tokens": {"bfloat16": dict.fromkeys(("1", "2-16", "17-64", "65-256", "257+"), "packed")}}


def test_w8a16_pack_quantized_groups_of_32_record_the_int8_planes(tmp_path):
    """compressed-tensors pack-quantized 8-bit g32 (llm-compressor's W8A16 with groups) in bfloat16."""
    path, reference = save_ct_checkpoint("llama", tmp_path / "w8a16", bits=8, group_size=32, **SIZES)
    model, report = loader.load_model_with_report(str(path), dtype="bfloat16")
    assert set(report.quantization["kernels"]) == {"int8planes"}
    ids = random_ids(reference.config.vocab_size)
    assert relative_error(_logits(model, ids).float(), reference_logits(reference, ids)) <= 3e-2


@pytest.mark.parametrize("sym", [True, False])
@pytest.mark.parametrize(("group", "kernel"), [(32, "int8planes"), (64, "int8groups"), (128, "int8groups"),
                                               (16, "int8groups")])
def test_the_grouped_int8_kernels_multiply_as_the_dequantized_weight(sym, group, kernel):
    """Groups of 32 as int4 planes, larger ones (and sizes the planes cannot take) one int8 call per group."""
    generator = torch.Generator().manual_seed(group)
    k, n = 256, 64
    codes = torch.randint(0, 256, (k, n), dtype=torch.uint8, generator=generator)
    scales = torch.rand(k // group, n, generator=generator) / 50
    zeros = torch.full(scales.shape, 128, dtype=torch.int32) if sym else \
        torch.randint(100, 156, scales.shape, dtype=torch.int32, generator=generator)
    weight = QuantizedWeight(codes, scales, zeros, default_g_idx(k, group), 8, group)
    chosen = choose_kernel(weight, "auto", torch.bfloat16)
    x = torch.randn(2, 3, k, generator=generator).to(torch.bfloat16)
    expected = x.float() @ weight.dequantize().t()
    assert chosen.choice == KernelChoice(kernel)
    assert relative_error(chosen.matmul(x).float(), expected) <= 1e-2
    assert choose_kernel(weight, "auto", torch.float32).choice.kernel == "dequantize"


def test_auto_chooses_by_device_and_dtype():
    w8a8 = Int8Activations(dynamic=True)
    assert wanted_int8_kernel("auto", True, torch.float32, torch.device("cpu")) == "dequantized"
    assert wanted_int8_kernel("auto", True, torch.bfloat16, torch.device("cpu")) == "int8_mm"
    assert wanted_int8_kernel("auto", False, torch.bfloat16, torch.device("cpu")) == "int8pack"
    plan = dict(symmetric=True, group_size=-1, requested="auto", dtype=torch.bfloat16,
                packed_plan=KernelChoice("int8pack"))
    assert plan_int8_kernel(w8a8, k=64, n=64, device=torch.device("cuda"), **plan) == KernelChoice("int8_mm")
    assert plan_int8_kernel(w8a8, k=60, n=64, device=torch.device("cuda"), **plan) == KernelChoice(
        "dequantized", "torch._int_mm on CUDA needs K and N multiples of 8, found K=60, N=64")
    assert plan_int8_kernel(None, k=64, n=64, device=torch.device("cuda"), **plan) == KernelChoice("dequantized")


def test_a_scale_of_the_wrong_shape_is_refused_by_name(tmp_path):
    path, _ = save_int8_checkpoint("llama", tmp_path / "m", int8_scheme("channel"), **SIZES)
    _rewrite(path, "model.layers.0.mlp.down_proj.weight_scale", lambda t: t.reshape(-1))
    with pytest.raises(ShapeMismatchError, match=(
            r"^tensor 'model\.layers\.0\.mlp\.down_proj\.weight_scale' in .*model\.safetensors: expected shape "
            r"\(64, 1\) for model\.layers\.0\.mlp\.down_proj, found \(64,\)$")):
        _load(path)


def test_int8_codes_stored_as_another_dtype_are_refused_by_name(tmp_path):
    path, _ = save_int8_checkpoint("llama", tmp_path / "m", int8_scheme("channel"), **SIZES)
    _rewrite(path, "model.layers.1.self_attn.o_proj.weight", lambda t: t.to(torch.float32))
    with pytest.raises(CheckpointFormatError, match=(
            r"^tensor 'model\.layers\.1\.self_attn\.o_proj\.weight' in .*model\.safetensors: "
            r"model\.layers\.1\.self_attn\.o_proj\.weight must be stored as int8 \(compressed-tensors "
            r"int-quantized\), found torch\.float32$")):
        _load(path)


@pytest.mark.parametrize(("scheme", "message"), [
    (int8_scheme("block"), "config.json quantization_config config_groups.group_0.weights: strategy 'block' is not "
                           "supported; expected one of ['channel', 'tensor', 'group']"),
    (int8_scheme("channel", activations="group"), "config.json quantization_config config_groups.group_0."
                                                  "input_activations: strategy 'group' is not supported for static "
                                                  "activations; expected one of ['tensor']"),
    ({**int8_scheme("channel"), "weights": {**int8_scheme()["weights"], "num_bits": 4}},
     "config.json quantization_config config_groups.group_0.weights: num_bits 4 type 'int' is not supported; "
     "int-quantized loads 8-bit ints"),
])
def test_an_unsupported_scheme_is_refused_with_its_field(scheme, message):
    with pytest.raises(UnsupportedError) as raised:
        int8_scheme_from_ct("group_0", scheme, None)
    assert str(raised.value) == message


def _rewrite(path, name, change):
    from safetensors.torch import load_file, save_file

    file = path / "model.safetensors"
    tensors = load_file(file)
    tensors[name] = change(tensors[name]).contiguous()
    save_file(tensors, file, metadata={"format": "pt"})


def test_static_input_scales_of_fused_parts_unite_their_ranges():
    """q, k and v read one input, quantized once: symmetric parts take the largest scale (vLLM's max); with zero
    points the range covering every part's range."""
    symmetric = Int8LinearMethod(int8_scheme_from_ct("g", int8_scheme("channel", activations="tensor"), None))
    state = Int8LayerState("qkv", (("q", 0, 4), ("k", 4, 2), ("v", 6, 2)), 8, 8, torch.float32,
                           per_tensor={"input_scale": {"q": 0.02, "k": 0.03, "v": 0.01}})
    assert symmetric._input_qparams(state) == (0.03, 0.0)
    asymmetric = Int8LinearMethod(int8_scheme_from_ct("g", int8_scheme("channel", activations="tensor",
                                                                       activation_symmetric=False), None))
    state.per_tensor["input_zero_point"] = {"q": 10.0, "k": -10.0, "v": 0.0}
    scale, zero = asymmetric._input_qparams(state)
    low, high = min((-128 - 10) * 0.02, (-128 + 10) * 0.03), max((127 - 10) * 0.02, (127 + 10) * 0.03)
    assert scale == pytest.approx((high - low) / 255) and zero == round(-128 - low / scale)


@pytest.mark.parametrize(("scheme", "dtype", "options"), [
    (int8_scheme("channel"), "float32", None),
    (int8_scheme("tensor", activations="tensor"), "bfloat16", None),
    (int8_scheme("group", activations=None), "bfloat16", None),
    (int8_scheme("group", group_size=64, activations=None), "bfloat16", None),
    (int8_scheme("group", activations=None), "float32", {"kernel": "int8pack"}),
    (int8_scheme("group"), "bfloat16", {"kernel": "int8_mm"}),
    (int8_scheme("channel"), "float32", {"kernel": "dequantize"}),
], ids=["channel-f32", "tensor-bf16", "group-bf16", "group64-bf16", "group-f32-int8pack", "group-int8-mm",
                              "dequantize"])
def test_the_plan_from_shapes_is_the_choice_made_at_load(tmp_path, scheme, dtype, options):
    path, _ = save_int8_checkpoint("qwen2", tmp_path / "m", scheme, **SIZES)
    planned = plan_layers(str(path), dtype=dtype, quantization=METHOD, quantization_options=options,
                          host=int8_host())
    _, report = _load(path, dtype, options)
    assert planned["layers"] == report.quantization["layers"]


@pytest.mark.parametrize("case", ["llama-channel-token", "qwen2-tensor-asym-static-asym"])
def test_int_quantized_checkpoints_load_through_the_compressed_tensors_config(tmp_path, case):
    """End to end: ``quant_method: compressed-tensors`` with an ``int-quantized`` group, no ``quantization=``."""
    family, scheme = CASES[case]
    path, reference = save_int8_checkpoint(family, tmp_path / case, scheme, **SIZES)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    ids = random_ids(reference.config.vocab_size)
    assert relative_error(_logits(model, ids), _expected(reference, scheme, ids)) <= 1e-3
    assert report.quantization["kernels"] == {"dequantized": 8}


def test_w8a8_inputs_are_rounded_as_the_producer_rounds_them(tmp_path):
    """Without the input rounding, the weight-only result is measurably off the W8A8 reference."""
    family, scheme = CASES["llama-channel-token"]
    path, reference = save_int8_checkpoint(family, tmp_path / "m", scheme, **SIZES)
    model, _ = _load(path)
    ids = random_ids(reference.config.vocab_size)
    weight_only = reference_logits(reference, ids)
    assert relative_error(_logits(model, ids), weight_only) > 2e-3
    assert relative_error(_logits(model, ids), _expected(reference, scheme, ids)) <= 1e-5
