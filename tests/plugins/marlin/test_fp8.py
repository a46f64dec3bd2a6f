"""FP8 checkpoints (``fp8``, ``fbgemm_fp8``, compressed-tensors ``float-quantized``): logits, kernels, refusals.

The reference (:mod:`tests.helpers.fp8_checkpoints`) is the ``transformers``
model holding the dequantized weights, its linears' inputs rounded to FP8
where the producer's CPU reference does so. Compressed-tensors checkpoints load
through the compressed-tensors dispatcher, which hands ``float-quantized``
groups to ``fp8_scheme_from_ct``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loader._pipeline.load import load_model_with_report
from loader._pipeline.plan import plan_layers
from loader.errors import CheckpointFormatError, ShapeMismatchError, UnsupportedError
from loader.kernels import KernelChoice
from loader.layers import QKVParallelLinear
from loader.layers.param_layout import weight_loader_of
from loader.testing import simulated_tp
from loader.weights import EagerTensor
from loader_plugin_marlin.fp8_config import fp8_config_from_checkpoint, fp8_scheme_from_ct
from loader_plugin_marlin.fp8_kernels import plan_fp8_kernel
from loader_plugin_marlin.fp8_method import Fp8LinearMethod
from tests.helpers.fp8_checkpoints import LAYOUTS, ct_fp8_group, input_rounding, save_fp8_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import BF16_TOLERANCE, random_ids

TOLERANCE = 1e-3


def load(path: Path, **kwargs):
    return load_model_with_report(str(path), dtype="float32", **kwargs)


def logits_error(model, reference) -> float:
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        return relative_error(model(ids), reference_logits(reference, ids))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_logits_match_the_dequantized_reference(tmp_path, layout, family):
    path, reference = save_fp8_checkpoint(family, tmp_path / "m", layout)
    model, report = load(path)
    assert logits_error(model, reference) <= TOLERANCE
    layers = report.quantization["layers"]
    assert set(layers) == {f"model.layers.{i}.{name}" for i in range(2)
                           for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")}
    assert {record["kernel"] for record in layers.values()} == {"fp8_dequantized"}


@pytest.mark.parametrize("layout", ["fp8-block", "fp8-tensor"])
def test_transformers_reads_the_fp8_checkpoints_as_the_loader_does(tmp_path, layout):
    """transformers loads ``quant_method: fp8`` on the CPU by dequantizing (inputs unrounded): the same logits.
    (It refuses a partial last block there, which the loader reads: test_partial_last_blocks_load.)"""
    import transformers

    path, _ = save_fp8_checkpoint("qwen2", tmp_path / "m", layout)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model, _ = load(path)
    assert logits_error(model, theirs) <= 1e-6


@pytest.mark.parametrize("layout", ["fp8-block", "ct-channel-token", "ct-tensor-static"])
def test_a_bfloat16_load_holds_the_weight_in_bfloat16(tmp_path, layout):
    """Against the reference run in bfloat16 too: rounding inputs to FP8 (6 % steps) turns bfloat16's small
    differences into whole steps, so the float32 reference is ~3e-2 away for the layouts that round them."""
    path, reference = save_fp8_checkpoint("llama", tmp_path / "m", layout)
    model, _ = load_model_with_report(str(path), dtype="bfloat16")
    assert model.model.layers[0].self_attn.qkv_proj.fp8_weight.dtype == torch.bfloat16
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        expected = reference_logits(reference.to(torch.bfloat16), ids).float()
        assert relative_error(model(ids).float(), expected) <= BF16_TOLERANCE


def test_activation_rounding_is_part_of_the_reference(tmp_path):
    """Without rounding the inputs the loader would be ~2 % off fbgemm's reference: the emulation is tested."""
    path, reference = save_fp8_checkpoint("llama", tmp_path / "m", "fbgemm")
    model, _ = load(path)
    for module in reference.modules():
        module._forward_pre_hooks.clear()
    assert logits_error(model, reference) > 1e-2


def test_fused_parts_with_different_static_input_scales_round_their_inputs_apart(tmp_path):
    """compressed-tensors rounds k_proj's input with k_proj's own ``input_scale``: a fused q/k/v does the same."""
    path, reference = save_fp8_checkpoint("qwen2", tmp_path / "m", "ct-tensor-static")
    name = "model.layers.0.self_attn.k_proj"
    scale = load_file(path / "model.safetensors")[f"{name}.input_scale"] * 1.7
    _rewrite(path, f"{name}.input_scale", scale)
    module = reference.get_submodule(name)
    module._forward_pre_hooks.clear()
    module.register_forward_pre_hook(input_rounding("ct-tensor-static", static=scale))
    model, _ = load(path)
    assert logits_error(model, reference) <= TOLERANCE


@pytest.mark.parametrize(("layout", "block", "grid"), [("fp8-block", (32, 32), (3, 2)),
                                                      ("ct-block-group", (32, 16), (3, 4))])
def test_partial_last_blocks_load(tmp_path, layout, block, grid):
    """hidden 80 with blocks of 32 rows: o_proj/down_proj end in half a block of rows (and with 32 columns, q/k/v
    in half a block of columns). compressed-tensors 0.20 writes these ceil grids too (it pads the weight); its
    per-group activations need the group to divide the input, hence 16 columns there."""
    path, reference = save_fp8_checkpoint("llama", tmp_path / "m", layout, block=block, hidden_size=80, head_dim=32,
                                          num_attention_heads=2, num_key_value_heads=1)
    weights = load_file(path / "model.safetensors")
    name = "weight_scale_inv" if layout == "fp8-block" else "weight_scale"
    assert weights[f"model.layers.0.self_attn.o_proj.{name}"].shape == grid
    model, _ = load(path)
    assert logits_error(model, reference) <= TOLERANCE


@pytest.mark.parametrize("layout", ["fbgemm", "ct-channel-token", "ct-tensor-static", "ct-tensor-dynamic"])
def test_forced_scaled_mm_runs_torchs_fp8_matmul_on_the_cpu(tmp_path, layout):
    path, reference = save_fp8_checkpoint("qwen2", tmp_path / "m", layout)
    model, report = load(path, quantization_options={"kernel": "scaled_mm"})
    assert report.quantization["kernels"] == {"fp8_scaled_mm": 8}
    assert logits_error(model, reference) <= TOLERANCE
    assert model.model.layers[0].mlp.down_proj.fp8_weight.dtype == torch.float8_e4m3fn


def test_layer_plan_returns_the_recorded_kernel_choice(tmp_path):
    path, _ = save_fp8_checkpoint("llama", tmp_path / "m", "fp8-block")
    model, report = load(path)
    layer = model.model.layers[1].self_attn.qkv_proj
    assert isinstance(layer.quant_method, Fp8LinearMethod)
    plan = layer.quant_method.layer_plan(layer)
    assert plan == KernelChoice("fp8_dequantized")
    assert report.quantization["layers"]["model.layers.1.self_attn.qkv_proj"] == plan.record()
    assert report.quantization["weights"] == "block" and report.quantization["block"] == [32, 32]


@pytest.mark.parametrize(("layout", "options"), [("fp8-block", None), ("fbgemm", {"kernel": "scaled_mm"}),
                                                ("ct-tensor-static", {"kernel": "scaled_mm"})])
def test_inspect_plans_from_shapes_what_the_load_records(tmp_path, layout, options):
    """``loader inspect --layers`` (the model on ``meta``, no weights read) plans each layer's recorded kernel."""
    path, _ = save_fp8_checkpoint("llama", tmp_path / "m", layout)
    planned = plan_layers(str(path), dtype="float32", quantization_options=options)
    _, report = load(path, quantization_options=options)
    kernels = {prefix: (record["kernel"], record["reason"]) for prefix, record in planned["layers"].items()}
    assert kernels == {prefix: (record["kernel"], record["reason"])
                       for prefix, record in report.quantization["layers"].items()}
    assert len(kernels) == 8


def _geometry_of(scheme_config, tp_rank=0, tp_size=1, hidden=256, heads=2):
    with simulated_tp(tp_rank, tp_size), torch.device("meta"):
        layer = QKVParallelLinear(hidden, hidden // heads, heads, heads, quant_config=scheme_config, prefix="attn.qkv")
    return layer.fp8_state.geometry


CT_CHANNEL = fp8_scheme_from_ct("g", ct_fp8_group("ct-channel-token", (32, 32)))
CT_STATIC = fp8_scheme_from_ct("g", ct_fp8_group("ct-tensor-static", (32, 32)))
FP8_BLOCK = fp8_config_from_checkpoint({"quant_method": "fp8", "weight_block_size": [128, 128]})


@pytest.mark.parametrize(("config", "parts", "capability", "expected"), [
    (CT_CHANNEL, 1, (9, 0), KernelChoice("fp8_scaled_mm")),
    (CT_STATIC, 1, (8, 9), KernelChoice("fp8_scaled_mm")),
    (CT_STATIC, 3, (8, 9), KernelChoice("fp8_dequantized", "torch._scaled_mm with row-wise scales needs compute "
                                        "capability 9.0 or newer, found (8, 9)")),
    (CT_CHANNEL, 1, (8, 9), KernelChoice("fp8_dequantized", "torch._scaled_mm with row-wise scales needs compute "
                                         "capability 9.0 or newer, found (8, 9)")),
    (CT_STATIC, 1, (8, 6), KernelChoice("fp8_dequantized", "torch._scaled_mm with per-tensor scales needs compute "
                                        "capability 8.9 or newer, found (8, 6)")),
    (FP8_BLOCK, 1, (9, 0), KernelChoice("fp8_dequantized", "block weight scales are dequantized (torch._scaled_mm "
                                        "takes per-tensor or row-wise scales)")),
])
def test_cuda_kernel_choice_follows_the_compute_capability(config, parts, capability, expected):
    geometry = _geometry_of(config)
    if parts == 1:
        geometry = type(geometry)(geometry.prefix, geometry.parts[:1], geometry.cols, geometry.input_size,
                                  geometry.input_start, geometry.tp_size, geometry.block)
    assert plan_fp8_kernel(config.scheme, geometry, "auto", torch.device("cuda"), capability) == expected


def test_cpu_kernel_choice_is_the_dequantized_matmul_unless_forced():
    geometry = _geometry_of(CT_CHANNEL)
    assert plan_fp8_kernel(CT_CHANNEL.scheme, geometry, "auto", torch.device("cpu"), None) == \
        KernelChoice("fp8_dequantized")
    assert plan_fp8_kernel(CT_CHANNEL.scheme, geometry, "scaled_mm", torch.device("cpu"), None) == \
        KernelChoice("fp8_scaled_mm")


@pytest.mark.parametrize("block", [[32, 32], None])
def test_a_pre_fused_checkpoint_lands_as_its_parts_do(block):
    """q/k/v stored as one tensor (and one block grid stacked by part, or one per-tensor scale) land where the
    three parts' own tensors do."""
    config = fp8_config_from_checkpoint({"quant_method": "fp8", "weight_block_size": block})
    name = "weight_scale_inv"
    by_parts, fused = (QKVParallelLinear(64, 16, 4, 2, quant_config=config, prefix="qkv") for _ in range(2))
    generator = torch.Generator().manual_seed(0)
    weights = {part: (torch.randn(rows, 64, generator=generator) * 0.1).to(torch.float8_e4m3fn)
               for part, rows in (("q", 64), ("k", 32), ("v", 32))}
    scales = {part: torch.rand((len(w) // 32, 2) if block else (), generator=generator) + 0.5
              for part, w in weights.items()}
    if not block:
        scales = dict.fromkeys(scales, scales["q"])  # one scale for the one stored tensor
    for part in "qkv":
        weight_loader_of(by_parts.weight)(by_parts.weight, EagerTensor(weights[part]), part)
        weight_loader_of(getattr(by_parts, name))(getattr(by_parts, name), EagerTensor(scales[part]), part)
    stacked = torch.cat([scales[part] for part in "qkv"]) if block else scales["q"]
    weight_loader_of(fused.weight)(fused.weight, EagerTensor(torch.cat(list(weights.values()))))
    weight_loader_of(getattr(fused, name))(getattr(fused, name), EagerTensor(stacked))
    assert torch.equal(fused.weight.view(torch.uint8), by_parts.weight.view(torch.uint8))
    assert torch.equal(getattr(fused, name), getattr(by_parts, name))


# -- refusals, each with its full message --------------------------------------------------------------------

def _rewrite(path: Path, name: str, value: torch.Tensor) -> None:
    tensors = load_file(path / "model.safetensors")
    tensors[name] = value
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def test_a_scale_of_the_wrong_shape_is_refused(tmp_path):
    path, _ = save_fp8_checkpoint("llama", tmp_path / "m", "fbgemm")
    name = "model.layers.0.mlp.down_proj.weight_scale"
    _rewrite(path, name, torch.ones(64))
    with pytest.raises(ShapeMismatchError) as caught:
        load(path)
    assert str(caught.value) == (f"tensor {name!r} in {path / 'model.safetensors'}: expected shape (64, 1) for "
                                 "model.layers.0.mlp.down_proj, found (64,)")


def test_a_block_grid_of_the_wrong_shape_is_refused(tmp_path):
    path, _ = save_fp8_checkpoint("llama", tmp_path / "m", "fp8-block")
    name = "model.layers.0.self_attn.k_proj.weight_scale_inv"
    _rewrite(path, name, torch.ones(2, 2))
    with pytest.raises(ShapeMismatchError) as caught:
        load(path)
    assert str(caught.value) == (
        f"tensor {name!r} in {path / 'model.safetensors'}: expected shape (1, 2) for "
        "model.layers.0.self_attn.qkv_proj.weight_scale_inv part 'k' (32x32 blocks over [32, 64]), found (2, 2)")


def test_a_bf16_weight_is_refused_where_float8_is_expected(tmp_path):
    path, _ = save_fp8_checkpoint("qwen2", tmp_path / "m", "ct-channel-token")
    name = "model.layers.1.mlp.up_proj.weight"
    _rewrite(path, name, torch.zeros(128, 64, dtype=torch.bfloat16))
    with pytest.raises(CheckpointFormatError) as caught:
        load(path)
    assert str(caught.value) == (
        f"tensor {name!r} in {path / 'model.safetensors'}: model.layers.1.mlp.gate_up_proj is an FP8 layer whose "
        "weight must be stored as F8_E4M3 (float8_e4m3fn), found bfloat16")


def test_an_unknown_fmt_is_refused(tmp_path):
    path, _ = save_fp8_checkpoint("llama", tmp_path / "m", "fp8-block")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["fmt"] = "e5m2"
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError) as caught:
        load(path)
    assert str(caught.value) == ("config.json quantization_config: fmt 'e5m2' is not supported; FP8 checkpoints "
                                 "load as 'e4m3' (float8_e4m3fn)")


def test_an_unknown_ct_strategy_is_refused():
    group = ct_fp8_group("ct-channel-token", (32, 32))
    group["weights"]["strategy"] = "group"
    with pytest.raises(UnsupportedError) as caught:
        fp8_scheme_from_ct("group_0", group, None)
    assert str(caught.value) == ("config.json quantization_config config_groups.group_0.weights: strategy 'group' "
                                 "is not supported; expected one of ['tensor', 'channel', 'block']")


def test_static_token_activations_are_refused():
    group = ct_fp8_group("ct-channel-token", (32, 32))
    group["input_activations"]["dynamic"] = False
    with pytest.raises(UnsupportedError) as caught:
        fp8_scheme_from_ct("group_0", group, None)
    assert str(caught.value) == (
        "config.json quantization_config config_groups.group_0.input_activations: strategy 'token' with dynamic "
        "False is not supported; expected 'token' (dynamic), 'tensor' (static or dynamic) or 'group' (dynamic)")


def test_a_tensor_parallel_size_that_cuts_a_block_is_refused():
    with pytest.raises(UnsupportedError) as caught:
        _geometry_of(FP8_BLOCK, tp_rank=1, tp_size=2, hidden=384, heads=6)
    assert str(caught.value) == (
        "attn.qkv: FP8 weight blocks of 128x128: tensor parallel size 2 gives this rank rows [192, 384) of part 'q' "
        "(384 rows), which cuts a block; each rank's rows must start and end on a multiple of 128")


def test_a_fused_part_starting_inside_a_block_is_refused():
    with pytest.raises(UnsupportedError) as caught:
        _geometry_of(FP8_BLOCK, hidden=192, heads=3)
    assert str(caught.value) == (
        "attn.qkv: FP8 weight blocks of 128x128: part 'k' starts at row 192 of the fused weight, inside a block; "
        "each fused part must hold whole blocks (part rows on this rank [192, 192, 192])")
