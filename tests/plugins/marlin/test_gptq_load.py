"""GPTQ checkpoints written by the reference packer load, compute the reference's logits, and fail by name."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.errors import CheckpointFormatError, ShapeMismatchError, UnsupportedError
from loader.testing import simulated_tp
from loader_plugin_marlin.config import GPTQConfig
from loader_plugin_marlin.layer_kernels import kernel_tensors
from loader_plugin_marlin.linear_method import PackedLinearMethod
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids

# hidden 96 with group 64: K = 96 is one full group and a partial one (as GPTQModel writes group 128 over K = 576)
PARTIAL = dict(hidden_size=96, intermediate_size=192, num_attention_heads=4, num_key_value_heads=2)
CASES = {
    "llama-sym-g32-v1": ("llama", dict(bits=4, group_size=32, sym=True, desc_act=False), {}),
    "llama-asym-actorder-v2": ("llama", dict(bits=4, group_size=32, sym=False, desc_act=True,
                                             checkpoint_format="gptq_v2"), {}),
    "qwen2-asym-g64-partial": ("qwen2", dict(bits=4, group_size=64, sym=False, desc_act=False), PARTIAL),
    "qwen2-sym-actorder-partial": ("qwen2", dict(bits=4, group_size=64, sym=True, desc_act=True), PARTIAL),
    "llama-8bit-channelwise": ("llama", dict(bits=8, group_size=-1, sym=True, desc_act=False), {}),
    "llama-8bit-g32-asym": ("llama", dict(bits=8, group_size=32, sym=False, desc_act=True), {}),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("gptq")
    return {case: save_gptq_checkpoint(family, root / case, **fields, **overrides)
            for case, (family, fields, overrides) in CASES.items()}


def _layers(model):
    return {name: m for name, m in model.named_modules() if isinstance(getattr(m, "quant_method", None),
                                                                       PackedLinearMethod)}


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_the_dequantized_reference_in_float32(checkpoints, case):
    path, reference = checkpoints[case]
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert len(_layers(model)) == 4 * reference.config.num_hidden_layers
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        error = relative_error(model(ids), reference_logits(reference, ids))
    assert error <= 1e-3, f"{case}: relative error {error:.3g}"
    quant = report.quantization
    assert quant["method"] == "gptq"
    assert sum(quant["kernels"].values()) == len(quant["layers"]) == len(_layers(model))
    expected = "int8pack" if case == "llama-8bit-channelwise" else "int4pack"
    if case == "llama-8bit-g32-asym":
        expected = "dequantize"
        assert all("8-bit with" in layer["reason"] for layer in quant["layers"].values())
    assert set(quant["kernels"]) == {expected}


def test_bfloat16_loads_use_the_packed_kernel_and_stay_close(checkpoints):
    path, reference = checkpoints["qwen2-sym-actorder-partial"]
    model = loader.load_model(str(path), dtype="bfloat16")
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        error = relative_error(model(ids).float(), reference_logits(reference, ids))
    assert error <= 3e-2


def test_the_dequantize_kernel_gives_the_same_logits_and_drops_the_checkpoint_parameters(checkpoints):
    path, reference = checkpoints["llama-asym-actorder-v2"]
    packed = loader.load_model(str(path), dtype="float32")
    plain, report = loader.load_model_with_report(str(path), dtype="float32",
                                                  quantization_options={"kernel": "dequantize"})
    assert set(report.quantization["kernels"]) == {"dequantize"}
    layer = next(iter(_layers(plain).values()))
    assert not [name for name, _ in layer.named_parameters(recurse=False) if name != "bias"]
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(packed(ids), plain(ids)) <= 1e-5


@pytest.mark.parametrize(("case", "kernel"), [("llama-sym-g32-v1", "int4pack"), ("llama-8bit-channelwise", "int8pack"),
                                            ("llama-asym-actorder-v2", "dequantize")])
def test_a_model_moved_after_loading_computes_with_the_moved_tensors(checkpoints, case, kernel):
    """``model.to(...)`` replaces the layers' buffers; the kernel must follow them, not keep the old tensors."""
    path, reference = checkpoints[case]
    model = loader.load_model(str(path), dtype="float32", quantization_options={"kernel": kernel})
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        before = model(ids)
    model.to(torch.float64)  # every float buffer is replaced by a new tensor
    layer = next(iter(_layers(model).values()))
    assert layer.quant_method.kernel(layer).choice.kernel == kernel
    moved = {id(t) for t in layer.buffers(recurse=False)}
    held = {id(t) for _, t in kernel_tensors(layer.quant_method.kernel(layer))}
    assert held <= moved, "the kernel still holds tensors the layer no longer has"
    model.to(torch.float32)
    with torch.no_grad():
        assert relative_error(model(ids), before) <= 1e-6


def test_a_quantized_lm_head_loads_packed_and_matches_the_reference(tmp_path):
    """GPTQModel's ``lm_head: true``: the head's qweight/qzeros/scales/g_idx load into the head (tp=2: torchrun)."""
    path, reference = save_gptq_checkpoint("llama", tmp_path / "head", bits=4, group_size=32, sym=False,
                                           desc_act=True, lm_head=True, tie_word_embeddings=False)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert report.quantization["lm_head"] is True
    assert {k: v for k, v in report.quantization["layers"]["lm_head"].items() if k != "by_tokens"} == {
        "kernel": "int4pack", "reason": None, "paths_from": "static"}
    assert not [name for name, _ in model.lm_head.named_parameters()]  # only the kernel's buffers
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(model(ids), reference_logits(reference, ids)) <= 1e-3


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("kernel", [None, "int8pack"])
def test_the_plan_from_shapes_is_the_choice_made_at_load(checkpoints, case, kernel):
    """``loader inspect --layers`` builds on meta and asks each layer: it must predict what loading chooses."""
    from loader._pipeline.plan import plan_layers

    path, _ = checkpoints[case]
    options = {"kernel": kernel} if kernel else None
    planned = plan_layers(str(path), dtype="float32", quantization_options=options)
    _, report = loader.load_model_with_report(str(path), dtype="float32", quantization_options=options)
    assert planned["layers"] == report.quantization["layers"]


def test_load_and_inspect_print_the_kernel_summary_with_each_fallback_reason(checkpoints):
    from tests.core.test_cli import run_cli

    path, _ = checkpoints["llama-8bit-g32-asym"]
    reason = "dequantize (6 layers): 8-bit with 2 groups: the int8 kernel takes one scale per output channel"
    loaded = run_cli("load", str(path))
    assert loaded.returncode == 0, loaded.stderr
    assert "  kernels        dequantize 8\n" in loaded.stdout and reason in loaded.stdout
    planned = run_cli("inspect", str(path), "--layers")
    assert planned.returncode == 0, planned.stderr
    assert "kernels on cpu (planned from shapes; no weights read): dequantize 8" in planned.stdout
    assert reason in planned.stdout


def test_gptqmodel_s_dynamic_rules_give_the_head_its_own_settings(tmp_path):
    """GPTQModel's ``lm_head=True`` writes ``dynamic: {"lm_head": {"bits": 8, "group_size": 32, ...}}``."""
    dynamic = {"lm_head": {"bits": 8, "group_size": 32, "sym": True, "desc_act": False, "mse": 2.4},
               "-:model.layers.1.mlp.down_proj": {}}
    path, reference = save_gptq_checkpoint("llama", tmp_path / "dynamic", bits=4, group_size=32, sym=False,
                                           desc_act=True, lm_head=True, dynamic=dynamic, tie_word_embeddings=False,
                                           keep_dense=("model.layers.1.mlp.down_proj",))
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    layers = report.quantization["layers"]
    assert layers["lm_head"] == {"kernel": "dequantize", "reason": "8-bit with 2 groups: the int8 kernel takes one "
                                                                   "scale per output channel"}
    assert "model.layers.1.mlp.down_proj" not in layers and layers["model.layers.0.mlp.down_proj"]["kernel"] == \
        "int4pack"
    assert report.quantization["dynamic"]["+:lm_head"] == {"bits": 8, "group_size": 32, "sym": True,
                                                          "act_order": False}
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(model(ids), reference_logits(reference, ids)) <= 1e-3


def _rewrite(src, dst, change):
    import shutil

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    change(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def _set(name, value):
    def change(tensors):
        tensors[name] = value(tensors[name])
    return change


BAD = {
    "qweight-rows": ("model.layers.0.mlp.down_proj.qweight", lambda t: t[:-1].clone(), ShapeMismatchError,
                     r"model.layers.0.mlp.down_proj.qweight.*expected shape \(16, 64\) for "
                     r"model.layers.0.mlp.down_proj, found \(15, 64\)"),
    "scales-groups": ("model.layers.0.self_attn.k_proj.scales", lambda t: t[:1].clone(), ShapeMismatchError,
                      r"self_attn.k_proj.scales.*expected shape \(2, 32\) for "
                      r"model.layers.0.self_attn.qkv_proj shard 'k', found \(1, 32\)"),
    "qzeros-columns": ("model.layers.1.mlp.up_proj.qzeros", lambda t: t[:, :-1].clone(), ShapeMismatchError,
                       r"mlp.up_proj.qzeros.*expected shape \(2, 16\) for model.layers.1.mlp.gate_up_proj shard 1"),
    "g_idx-length": ("model.layers.0.self_attn.o_proj.g_idx", lambda t: t[:-8].clone(), ShapeMismatchError,
                     r"o_proj.g_idx.*expected shape \(64,\) for model.layers.0.self_attn.o_proj, found \(56,\)"),
    "g_idx-range": ("model.layers.0.self_attn.o_proj.g_idx", lambda t: t + 1, CheckpointFormatError,
                    r"^model.layers.0.self_attn.o_proj.g_idx: group numbers span \[1, 2\] but scales have "
                    r"groups \[0, 1\]$"),
    "g_idx-group-size": ("model.layers.0.mlp.gate_proj.g_idx", lambda t: torch.zeros_like(t), CheckpointFormatError,
                         r"^model.layers.0.mlp.gate_up_proj.g_idx: row 32 is in group 0, but with group_size 32 "
                         r"without act-order it belongs to group 1$"),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_bad_tensors_fail_naming_the_tensor_or_layer(checkpoints, tmp_path, bad):
    name, value, error, message = BAD[bad]
    src = checkpoints["llama-sym-g32-v1"][0]
    changes = [_set(name, value)]
    if bad == "g_idx-group-size":  # every fused part changed alike, so only the group check can object
        changes.append(_set(name.replace("gate_proj", "up_proj"), value))
    path = _rewrite(src, tmp_path / bad, lambda t: [c(t) for c in changes])
    with pytest.raises(error, match=message):
        loader.load_model(str(path), dtype="float32")


def test_fused_parts_with_different_g_idx_are_refused(checkpoints, tmp_path):
    src = checkpoints["llama-asym-actorder-v2"][0]
    path = _rewrite(src, tmp_path / "fused", _set("model.layers.0.self_attn.v_proj.g_idx", lambda t: t.flip(0)))
    with pytest.raises(CheckpointFormatError, match=r"model.layers.0.self_attn.qkv_proj.g_idx of part 'v' differs "
                       r"from part '[qk]'; the fused parts share one input and must share one g_idx"):
        loader.load_model(str(path), dtype="float32")


def test_a_tp_size_that_splits_a_group_or_a_packed_word_is_refused_naming_the_layer():
    from loader.layers import ColumnParallelLinear, RowParallelLinear

    with simulated_tp(1, 2), pytest.raises(UnsupportedError, match=(
            r"^model.layers.0.mlp.down_proj: tensor parallel size 2 gives each rank 96 of the 192 input rows, "
            r"which cuts a group of 64 rows; scales and zero points cannot be split inside a group$")):
        RowParallelLinear(192, 96, quant_config=GPTQConfig(group_size=64), prefix="model.layers.0.mlp.down_proj")
    with simulated_tp(0, 4), pytest.raises(UnsupportedError, match=(
            r"^o_proj: 4 input rows per rank \(tensor parallel size 4\) are not whole int32 words of 8 4-bit codes")):
        RowParallelLinear(16, 32, quant_config=GPTQConfig(group_size=-1), prefix="o_proj")
    with simulated_tp(0, 4), pytest.raises(UnsupportedError, match=(
            r"^up: 4 output columns of a part per rank \(tensor parallel size 4\) are not whole int32 words")):
        ColumnParallelLinear(64, 16, quant_config=GPTQConfig(group_size=32), prefix="up")
    # act-order keeps the groups whole on every rank, so the same split is fine there
    with simulated_tp(1, 2):
        layer = RowParallelLinear(192, 96, quant_config=GPTQConfig(group_size=64, act_order=True), prefix="d")
    assert tuple(layer.scales.shape) == (3, 96) and tuple(layer.g_idx.shape) == (96,)
