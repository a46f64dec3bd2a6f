"""GPTQ and compressed-tensors experts of Mixtral, Qwen2-MoE and Qwen3-MoE: packed per expert, the dequantized
reference's logits, tensor and expert parallel shards that add up, and bad expert tensors named.

The checkpoints are laid out as GPTQModel and llm-compressor write MoE models (one tensor set per expert part,
routers dense), by the project's own packers (:mod:`tests.helpers.moe_packed_checkpoints`); the tools' own
output is checked in ``test_gptqmodel.py`` and ``test_compressed_tensors_library.py`` (external envs).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.errors import CheckpointFormatError, MissingWeightsError, ShapeMismatchError, UnsupportedError
from loader.layers import FusedMoE, UnquantizedLinearMethod
from loader.testing import simulated_tp
from loader_plugin_marlin.fused_moe_method import PackedFusedMoEMethod
from loader_plugin_marlin.layer_kernels import kernel_tensors
from loader_plugin_marlin.linear_method import PackedLinearMethod
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids
from tests.helpers.moe_packed_checkpoints import save_ct_moe_checkpoint, save_gptq_moe_checkpoint

WRITERS = {"gptq": save_gptq_moe_checkpoint, "ct": save_ct_moe_checkpoint}
CASES = {
    "qwen3_moe-gptq-sym-g32-v1": ("qwen3_moe", dict(bits=4, group_size=32, sym=True, desc_act=False), "int4pack"),
    "mixtral-gptq-asym-actorder-v2": ("mixtral", dict(bits=4, group_size=32, sym=False, desc_act=True,
                                                      checkpoint_format="gptq_v2"), "int4pack"),
    "qwen2_moe-gptq-asym-actorder-v1": ("qwen2_moe", dict(bits=4, group_size=32, sym=False, desc_act=True),
                                        "int4pack"),
    "qwen3_moe-gptq-8bit-channelwise": ("qwen3_moe", dict(bits=8, group_size=-1, sym=True), "int8pack"),
    "qwen3_moe-ct-w4a16-g32": ("qwen3_moe", dict(bits=4, group_size=32, sym=True), "int4pack"),
    "mixtral-ct-w4a16-asym-actorder": ("mixtral", dict(bits=4, group_size=32, sym=False, actorder=True),
                                       "int4pack"),
    "qwen2_moe-ct-w8a16-channel": ("qwen2_moe", dict(bits=8, group_size=-1, sym=True), "int8pack"),
}
# down_proj's 128 intermediate rows over two ranks are 64 each: whole groups of 32 and whole int32 words
TP_SIZES = dict(hidden_size=128, moe_intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)


def _writer(case):
    return WRITERS[case.split("-")[1]]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("moe-packed")
    return {case: _writer(case)(family, root / case, **fields) for case, (family, fields, _) in CASES.items()}


@pytest.fixture(scope="module")
def tp_checkpoint(tmp_path_factory):
    """Asymmetric act-order GPTQ: each rank's down rows come from any group (kernel groups padded)."""
    path = tmp_path_factory.mktemp("moe-tp") / "qwen3_moe"
    return save_gptq_moe_checkpoint("qwen3_moe", path, group_size=32, sym=False, desc_act=True, **TP_SIZES)


def _experts(model):
    return [m for m in model.modules() if isinstance(m, FusedMoE)]


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_the_dequantized_reference(checkpoints, case):
    path, reference = checkpoints[case]
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    experts = _experts(model)
    assert experts and all(isinstance(layer.quant_method, PackedFusedMoEMethod) for layer in experts)
    assert not [name for layer in experts for name, _ in layer.named_parameters(recurse=False)]  # kernels only
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        error = relative_error(model(ids), reference_logits(reference, ids))
    assert error <= 1e-3, f"{case}: relative error {error:.3g}"
    layers = report.quantization["layers"]
    assert {layers[layer.prefix]["kernel"] for layer in experts} == {CASES[case][2]}


def test_routers_and_the_shared_expert_gate_stay_dense(checkpoints):
    path, _ = checkpoints["qwen2_moe-gptq-asym-actorder-v1"]
    block = loader.load_model(str(path), dtype="float32").model.layers[0].mlp
    assert isinstance(block.gate.quant_method, UnquantizedLinearMethod)
    assert isinstance(block.shared_expert_gate.quant_method, UnquantizedLinearMethod)
    assert isinstance(block.shared_expert.gate_up_proj.quant_method, PackedLinearMethod)


def test_bfloat16_loads_stay_close(checkpoints):
    path, reference = checkpoints["mixtral-gptq-asym-actorder-v2"]
    model = loader.load_model(str(path), dtype="bfloat16")
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(model(ids).float(), reference_logits(reference, ids)) <= 3e-2


@pytest.mark.parametrize("case", ["mixtral-gptq-asym-actorder-v2", "qwen2_moe-ct-w8a16-channel"])
@pytest.mark.parametrize("kernel", [None, "dequantize"])
def test_the_plan_from_shapes_is_the_choice_made_at_load(checkpoints, case, kernel):
    """``loader inspect --layers`` builds on meta and asks each layer: it must predict what loading chooses."""
    from loader._pipeline.plan import plan_layers

    path, _ = checkpoints[case]
    options = {"kernel": kernel} if kernel else None
    planned = plan_layers(str(path), dtype="float32", quantization_options=options)
    _, report = loader.load_model_with_report(str(path), dtype="float32", quantization_options=options)
    loaded = report.quantization["layers"]
    assert {prefix: planned["layers"][prefix] for prefix in loaded} == loaded
    dense = {prefix for prefix in planned["layers"] if prefix not in loaded}
    assert dense and all(prefix.endswith((".mlp.gate", ".shared_expert_gate")) for prefix in dense)  # routers
    assert all(planned["layers"][prefix] == {"kernel": "dense", "reason": None} for prefix in dense)


def test_a_moved_model_computes_with_the_moved_expert_buffers(checkpoints):
    path, reference = checkpoints["qwen3_moe-gptq-sym-g32-v1"]
    model = loader.load_model(str(path), dtype="float32")
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        before = model(ids)
    model.to(torch.float64)
    layer = _experts(model)[0]
    kernel = layer.quant_method.kernel(layer, "w2", 3)
    assert {id(t) for _, t in kernel_tensors(kernel)} <= {id(t) for t in layer.buffers(recurse=False)}
    model.to(torch.float32)
    with torch.no_grad():
        assert relative_error(model(ids), before) <= 1e-6


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_two_simulated_ranks_add_up_to_the_whole_layer(tp_checkpoint, expert_parallel):
    """Each rank's experts give a partial sum (the all-reduce adds them under torchrun); both ranks' sum is
    the one-rank layer's output, and the whole one-rank model matches the reference."""
    path, reference = tp_checkpoint
    whole = loader.load_model(str(path), dtype="float32")
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(whole(ids), reference_logits(reference, ids)) <= 1e-3
    block = whole.model.layers[1].mlp
    hidden = torch.randn(7, TP_SIZES["hidden_size"], generator=torch.Generator().manual_seed(3))
    logits = block.gate(hidden)
    partial, held = [], []
    for rank in range(2):
        with simulated_tp(rank, 2):
            model = loader.load_model(str(path), dtype="float32", enable_expert_parallel=expert_parallel)
        experts = model.model.layers[1].mlp.experts
        held.append(list(experts.placement.local_experts))
        with torch.no_grad():
            partial.append(experts(hidden, logits))
    with torch.no_grad():
        expected = block.experts(hidden, logits)
    assert held == ([[0, 1], [2, 3]] if expert_parallel else [[0, 1, 2, 3]] * 2)
    assert relative_error(partial[0] + partial[1], expected) <= 1e-5


def test_a_tp_size_that_cuts_a_group_of_the_down_projection_is_refused(checkpoints):
    path, _ = checkpoints["qwen3_moe-gptq-sym-g32-v1"]
    with simulated_tp(0, 2), pytest.raises(UnsupportedError, match=(
            r"^model\.layers\.0\.mlp\.experts \(down_proj\): tensor parallel size 2 gives each rank 16 of the 32 "
            r"input rows, which cuts a group of 32 rows; scales and zero points cannot be split inside a group$")):
        loader.load_model(str(path), dtype="float32")
    with simulated_tp(1, 2):  # whole experts per rank: nothing is cut
        model = loader.load_model(str(path), dtype="float32", enable_expert_parallel=True)
    assert list(_experts(model)[0].placement.local_experts) == [2, 3]


def _rewrite(src, dst, change):
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    change(tensors)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_an_expert_tensor_of_the_wrong_shape_is_named(checkpoints, tmp_path):
    name = "model.layers.0.mlp.experts.2.down_proj.qweight"
    path = _rewrite(checkpoints["qwen3_moe-gptq-sym-g32-v1"][0], tmp_path / "bad",
                    lambda t: t.update({name: t[name][:-1].clone()}))
    with pytest.raises(ShapeMismatchError, match=(
            r"tensor 'model\.layers\.0\.mlp\.experts\.2\.down_proj\.qweight' in .*: expected shape \(4, 64\) for "
            r"model\.layers\.0\.mlp\.experts shard 'w2', found \(3, 64\)")):
        loader.load_model(str(path), dtype="float32")


def test_an_expert_missing_its_qzeros_is_named(checkpoints, tmp_path):
    path = _rewrite(checkpoints["mixtral-gptq-asym-actorder-v2"][0], tmp_path / "missing",
                    lambda t: t.pop("model.layers.1.block_sparse_moe.experts.3.w3.qzeros"))
    with pytest.raises(MissingWeightsError, match=(
            r"the experts 'model\.layers\.1\.mlp\.experts' \(num_experts=4\) lack "
            r"'model\.layers\.1\.mlp\.experts\.3\.w3\.qzeros' in the checkpoint")):
        loader.load_model(str(path), dtype="float32")


def test_gate_and_up_of_an_expert_with_different_g_idx_are_refused(checkpoints, tmp_path):
    name = "model.layers.0.mlp.experts.1.up_proj.g_idx"
    path = _rewrite(checkpoints["qwen2_moe-gptq-asym-actorder-v1"][0], tmp_path / "g_idx",
                    lambda t: t.update({name: t[name].flip(0).contiguous()}))
    with pytest.raises(CheckpointFormatError, match=(
            r"model\.layers\.0\.mlp\.experts\.1\.gate_proj\+up_proj\.g_idx of part 'w[13]' differs from part "
            r"'w[13]'; the fused parts share one input and must share one g_idx")):
        loader.load_model(str(path), dtype="float32")


def test_a_compressed_tensors_weight_shape_that_disagrees_is_named(checkpoints, tmp_path):
    name = "model.layers.1.mlp.experts.0.down_proj.weight_shape"
    path = _rewrite(checkpoints["qwen3_moe-ct-w4a16-g32"][0], tmp_path / "shape",
                    lambda t: t.update({name: torch.tensor([64, 64])}))
    with pytest.raises(CheckpointFormatError, match=(
            r"weight_shape' in .*: records an unpacked weight of shape \[64, 64\], but "
            r"model\.layers\.1\.mlp\.experts\.0\.down_proj has shape \[64, 32\]")):
        loader.load_model(str(path), dtype="float32")


def test_a_skip_list_naming_only_some_experts_is_refused(checkpoints, tmp_path):
    path = shutil.copytree(checkpoints["qwen3_moe-gptq-sym-g32-v1"][0], tmp_path / "skip")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["model.layers.0.mlp.experts.1.gate_proj"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedError, match=(
            r"keeps model\.layers\.0\.mlp\.experts\.1\.gate_proj unquantized but quantizes other experts of "
            r"model\.layers\.0\.mlp\.experts \(1 of 12 expert parts skipped\)")):
        loader.load_model(str(path), dtype="float32")
