"""compressed-tensors configs as llm-compressor writes them: several groups, pattern targets, a quantized head.

Each checkpoint is packed per module by the tests' pack-quantized packer
(:mod:`tests.helpers.compressed_tensors_checkpoints`) following the group the
module belongs to, and its reference is the ``transformers`` model holding the
dequantized weights; logits must agree within 1e-3 in float32.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader._pipeline.plan import plan_layers
from loader.errors import CheckpointFormatError, ConfigError, UnsupportedError
from loader.layers import UnquantizedLinearMethod
from loader_plugin_marlin.compressed_tensors_config import ct_config_from_checkpoint
from tests.helpers.compressed_tensors_checkpoints import ct_group, ct_tensors, pack_compressed_tensors
from tests.helpers.gptq_checkpoints import LINEARS, dequantize, input_seed, quantize_with, save_packed_checkpoint
from tests.helpers.hf_checkpoints import build_model, reference_logits, relative_error
from tests.helpers.model_checks import random_ids

ATTENTION = r"re:.*self_attn\.(q|k|v|o)_proj$"
MLP = r"re:.*mlp\.(gate|up|down)_proj$"


def _config(groups: dict[str, dict[str, Any]], ignore: list[str], **extra: Any) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": groups, "ignore": ignore, **extra}


def _save(family: str, path: Path, declared: dict[str, Any], settings: dict[str, tuple[int, int, bool]],
          **overrides: Any) -> tuple[Path, Any]:
    """Pack each module with the (bits, group size, sym) of the first ``settings`` pattern it matches."""
    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        bits, group_size, sym = next(value for pattern, value in settings.items() if re.match(pattern, module))
        return pack_compressed_tensors(weight, bits, group_size, sym=sym, actorder=False, seed=input_seed(module))

    packed = LINEARS + (("lm_head",) if "lm_head" not in declared["ignore"] else ())
    return save_packed_checkpoint(family, path, declared, pack, packed_modules=packed, **overrides)


def _error(model: Any, reference: Any) -> float:
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        return relative_error(model(ids), reference_logits(reference, ids))


def test_two_groups_give_attention_8_bits_per_channel_and_the_mlp_4_bits_in_groups(tmp_path) -> None:
    declared = _config({"attention": ct_group(8, -1, sym=True, targets=(ATTENTION,)),
                        "mlp": ct_group(4, 32, sym=False, targets=(MLP,))}, ["lm_head"])
    path, reference = _save("llama", tmp_path, declared, {r".*self_attn": (8, -1, True), r".*mlp": (4, 32, False)})
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    layers = report.quantization["layers"]
    assert layers["model.layers.0.self_attn.qkv_proj"]["kernel"] == "int8pack"
    assert layers["model.layers.1.mlp.gate_up_proj"]["kernel"] == "int4pack"
    assert set(report.quantization["groups"]) == {"attention", "mlp"}


def test_a_quantized_output_head_loads_into_the_head(tmp_path) -> None:
    declared = _config({"group_0": ct_group(4, 32, sym=True)}, [])
    path, reference = _save("llama", tmp_path, declared, {".*": (4, 32, True)}, tie_word_embeddings=False)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    assert report.quantization["layers"]["lm_head"]["kernel"] == "int4pack"


def test_a_more_specific_target_wins_over_the_class(tmp_path) -> None:
    declared = _config({"all": ct_group(4, 32, sym=True),
                        "down": ct_group(8, -1, sym=True, targets=(r"re:.*down_proj$",))}, ["lm_head"])
    path, reference = _save("qwen2", tmp_path, declared, {r".*down_proj": (8, -1, True), ".*": (4, 32, True)})
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    assert report.quantization["layers"]["model.layers.0.mlp.down_proj"]["kernel"] == "int8pack"
    assert report.quantization["layers"]["model.layers.0.mlp.gate_up_proj"]["kernel"] == "int4pack"


def test_a_dense_group_is_quantized_at_load_as_compressed_tensors_forward_does(tmp_path) -> None:
    """Saved uncompressed (``frozen``): the float weights are not the quantized ones; their scales say how."""
    declared = _config({"mlp": ct_group(4, 32, sym=True, targets=(MLP,)),
                        "attention": ct_group(8, -1, sym=True, targets=(ATTENTION,), fmt="dense")}, ["lm_head"])
    path, reference = _save("llama", tmp_path, declared, {r".*mlp": (4, 32, True), ".*": (8, -1, True)})
    tensors = {name: t for name, t in load_file(path / "model.safetensors").items() if ".self_attn." not in name}
    float_weights = build_model("llama", reference.config, seed=7).state_dict()
    for name, param in reference.state_dict().items():
        if ".self_attn." not in name:
            continue
        weight = float_weights[name]
        tensors[name] = weight.contiguous()
        if name.endswith("proj.weight"):
            scale = weight.abs().amax(dim=1, keepdim=True) / 127
            tensors[name.replace(".weight", ".weight_scale")] = scale
            tensors[name.replace(".weight", ".weight_zero_point")] = torch.zeros_like(scale, dtype=torch.int8)
            weight = torch.round(torch.clamp(weight / scale, -128, 127)) * scale
        with torch.no_grad():
            param.copy_(weight)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    assert report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]["kernel"] == "int8pack"


def test_a_dense_group_without_weight_quantization_keeps_its_floats(tmp_path) -> None:
    declared = _config({"mlp": ct_group(4, 32, sym=True, targets=(MLP,)),
                        "attention": {"targets": [ATTENTION], "weights": None, "format": "dense"}}, ["lm_head"])
    path, reference = _save("llama", tmp_path, declared, {r".*mlp": (4, 32, True), ".*": (8, -1, True)})
    tensors = {name: t for name, t in load_file(path / "model.safetensors").items() if ".self_attn." not in name}
    for name, param in reference.state_dict().items():
        if ".self_attn." in name:
            tensors[name] = param.contiguous()
            if name.endswith("proj.weight"):  # an observer's leftovers, saved beside an unquantized weight
                tensors[name.replace(".weight", ".weight_scale")] = torch.ones(param.shape[0], 1)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    model = loader.load_model(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    assert isinstance(model.model.layers[0].self_attn.qkv_proj.quant_method, UnquantizedLinearMethod)


def _kv_checkpoint(tmp_path: Path, skip: str | None = None) -> tuple[Path, Any]:
    declared = _config({"group_0": ct_group(4, 32, sym=True)}, ["lm_head"],
                       kv_cache_scheme={"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                                        "symmetric": True})
    path, reference = _save("llama", tmp_path, declared, {".*": (4, 32, True)})
    tensors = load_file(path / "model.safetensors")
    for layer in range(reference.config.num_hidden_layers):
        for which in ("k", "v"):
            tensors[f"model.layers.{layer}.self_attn.{which}_scale"] = torch.tensor(0.002)
    tensors.pop(skip, None)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path, reference


def test_kv_cache_scales_reach_the_attention_layers_which_round_keys_and_values(tmp_path) -> None:
    path, reference = _kv_checkpoint(tmp_path)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    layers = reference.config.num_hidden_layers
    assert report.quantization["kv_cache"]["scales"] == 2 * layers
    assert report.quantization["kv_cache"]["applied"] == layers
    attention = model.model.layers[1].self_attn.attn
    assert attention.kv_fp8 and float(attention.v_scale) == pytest.approx(0.002)
    assert 1e-6 < _error(model, reference) < 0.05  # rounded keys and values: close to, not equal to, the floats


def test_kv_cache_scales_missing_for_a_layer_are_named(tmp_path) -> None:
    path, _ = _kv_checkpoint(tmp_path, skip="model.layers.1.self_attn.v_scale")
    with pytest.raises(CheckpointFormatError, match=r"^FP8 KV cache of 'model.layers.1.self_attn': the checkpoint "
                                                    r"has no model.layers.1.self_attn.v_scale$"):
        loader.load_model(str(path), dtype="float32")


def test_a_target_that_matches_no_layer_is_named(tmp_path) -> None:
    declared = _config({"group_0": ct_group(4, 32, sym=True),
                        "experts": ct_group(4, 32, sym=True, targets=(r"re:.*experts.*",))}, ["lm_head"])
    path, _ = _save("llama", tmp_path, declared, {".*": (4, 32, True)})
    with pytest.raises(ConfigError, match=r"config.json quantization_config: config_groups.experts.targets "
                                          r"'re:.\*experts.\*' matches no module of the model; a target written for "
                                          r"another model, or misspelt, would leave its layers unquantized"):
        loader.load_model(str(path), dtype="float32")


def test_parts_of_one_fused_layer_in_different_groups_are_refused(tmp_path) -> None:
    declared = _config({"q": ct_group(8, -1, sym=True, targets=(r"re:.*q_proj$",)),
                        "rest": ct_group(4, 32, sym=True)}, ["lm_head"])
    path, _ = _save("llama", tmp_path, declared, {r".*q_proj": (8, -1, True), ".*": (4, 32, True)})
    with pytest.raises(UnsupportedError, match=r"config_groups give the parts of model.layers.0.self_attn.qkv_proj "
                                               r"different schemes \{'model.layers.0.self_attn.q_proj': 'q', "
                                               r"'model.layers.0.self_attn.k_proj': 'rest', .*they share one fused "
                                               r"weight"):
        loader.load_model(str(path), dtype="float32")


def test_a_quantized_embedding_is_refused_by_name(tmp_path) -> None:
    declared = _config({"group_0": ct_group(4, 32, sym=True, targets=("Linear", "Embedding"))}, ["lm_head"])
    path, _ = _save("llama", tmp_path, declared, {".*": (4, 32, True)})
    with pytest.raises(UnsupportedError, match=r"config_groups.group_0 quantizes the embedding model.embed_tokens "
                                               r"\(pack-quantized\), which is not supported; keep it in 'ignore'"):
        loader.load_model(str(path), dtype="float32")


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"transform_config": {"config_groups": {"R1": {}}}}, UnsupportedError,
     r"transform_config.config_groups.R1: transform type None is not supported"),
    ({"sparsity_config": {"format": "sparse-24-bitmask"}}, UnsupportedError,
     r"sparsity_config format 'sparse-24-bitmask' \(compressed 2:4 sparse weights\) is not supported"),
    ({"ignore": ["re:(unclosed"]}, ConfigError, r"ignore entry 're:\(unclosed' is not a regular expression"),
    ({"config_groups": {"g": {**ct_group(4, 32, sym=True), "targets": "Linear"}}}, ConfigError,
     r"config_groups.g.targets must be a list of module names, class names or 're:' patterns, found 'Linear'"),
    ({"config_groups": {"g": {**ct_group(4, 32, sym=True), "targets": []}}}, ConfigError,
     r"config_groups.g.targets is empty"),
    ({"kv_cache_scheme": "fp8"}, ConfigError, r"kv_cache_scheme must be an object or null, found 'fp8'"),
])
def test_bad_configs_are_named(change, error, message) -> None:
    declared = {**_config({"group_0": ct_group(4, 32, sym=True)}, ["lm_head"]), **change}
    with pytest.raises(error, match=message):
        ct_config_from_checkpoint(declared)


def test_inspect_plans_each_layer_with_its_group_without_loading(tmp_path) -> None:
    declared = _config({"attention": ct_group(8, -1, sym=True, targets=(ATTENTION,)),
                        "mlp": ct_group(4, 32, sym=False, targets=(MLP,))}, ["lm_head"])
    path, _ = _save("llama", tmp_path, declared, {r".*self_attn": (8, -1, True), r".*mlp": (4, 32, False)})
    plan = plan_layers(str(path))
    assert plan["layers"]["model.layers.0.self_attn.qkv_proj"] == {
        "kernel": "int8pack", "reason": None, "scheme": "attention: pack-quantized w8 int channel",
        "by_tokens": {"bfloat16": dict.fromkeys(("1", "2-16", "17-64", "65-256", "257+"), "packed")},
        "paths_from": "static"}
    assert plan["layers"]["model.layers.1.mlp.down_proj"]["scheme"] == "mlp: pack-quantized w4 int group 32 asym"
    assert plan["quantization"]["groups"]["mlp"]["targets"] == [MLP]


def test_strategy_tensor_gives_each_part_of_a_fused_layer_its_own_scale(tmp_path) -> None:
    """W4A16 ``strategy: tensor``: one ``[1]`` scale per checkpoint module; q, k and v keep theirs."""
    group = ct_group(4, -1, sym=True)
    group["weights"]["strategy"] = "tensor"

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        n, k = weight.shape
        scale = (weight.abs().max() / 7).to(torch.float16)
        q = quantize_with(weight, scale.expand(1, n).clone(), torch.full((1, n), 8, dtype=torch.int32),
                          torch.zeros(k, dtype=torch.int32), 4)
        tensors = ct_tensors(q, sym=True)
        tensors["weight_scale"] = scale.float().reshape(1)
        return tensors, dequantize(q)

    path, reference = save_packed_checkpoint("llama", tmp_path, _config({"group_0": group}, ["lm_head"]), pack)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert _error(model, reference) <= 1e-3
    assert report.quantization["layers"]["model.layers.0.self_attn.qkv_proj"]["kernel"] == "int4pack"
    scales = {name: t for name, t in load_file(path / "model.safetensors").items() if name.endswith("_scale")}
    assert len({float(scales[f"model.layers.0.self_attn.{p}_proj.weight_scale"]) for p in "qkv"}) == 3
