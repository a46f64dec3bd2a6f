"""The fused-experts layer: routing, placement over ranks, the expert-aware loader and the grouped forward."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loader._distributed import simulated_tp
from loader.errors import MissingWeightsError, ShapeMismatchError, UnexpectedWeightError, UnsupportedError
from loader.layers import (
    ExpertNames,
    ExpertTarget,
    FusedMoE,
    TopKRouting,
    place_experts,
    run_chosen_experts,
    select_experts,
)
from loader.weights import EagerTensor
from tests.helpers.recording_tensor import RecordingTensor

EXPERTS, HIDDEN, INTER, TOP_K = 4, 16, 8, 2


def _experts(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"{e}.{part}": torch.randn(shape, generator=g)
            for e in range(EXPERTS)
            for part, shape in (("gate_proj", (INTER, HIDDEN)), ("up_proj", (INTER, HIDDEN)),
                                ("down_proj", (HIDDEN, INTER)))}


def _reference(x: torch.Tensor, logits: torch.Tensor, weights: dict[str, torch.Tensor],
               renormalize: bool = True) -> torch.Tensor:
    """Every expert computed densely, then the chosen ones weighted: the definition, not the grouped path."""
    probs = torch.softmax(logits, dim=-1)
    top, ids = torch.topk(probs, TOP_K, dim=-1)
    if renormalize:
        top = top / top.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(EXPERTS):
        y = F.linear(F.silu(F.linear(x, weights[f"{e}.gate_proj"])) * F.linear(x, weights[f"{e}.up_proj"]),
                     weights[f"{e}.down_proj"])
        chosen = ((ids == e) * top).sum(-1, keepdim=True)
        out += chosen * y
    return out


def _inputs(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded hidden states and router logits: outputs of ~20 need a tolerance relative to their size."""
    g = torch.Generator().manual_seed(tokens)
    return torch.randn(tokens, HIDDEN, generator=g), torch.randn(tokens, EXPERTS, generator=g)


def _layer(weights: dict[str, torch.Tensor] | None = None, *, prefix: str = "mlp.experts") -> FusedMoE:
    layer = FusedMoE(EXPERTS, TOP_K, HIDDEN, INTER, params_dtype=torch.float32, prefix=prefix)
    if weights is not None:
        _load(layer, weights)
    return layer


def _load(layer: FusedMoE, weights: dict[str, torch.Tensor], skip: str = "") -> None:
    params = dict(layer.named_parameters())
    for key, tensor in weights.items():
        name = f"model.layers.0.{layer.prefix}.{key}.weight"
        if key == skip:
            continue
        target = layer.names.target(name)
        assert target is not None
        param = params[target.param_name.rpartition(".experts.")[2]]
        layer.weight_loader(param, EagerTensor(tensor, name), name, target.shard_id, target.expert_id)


def test_select_experts_softmax_then_top_k_with_and_without_renormalising():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    weights, ids = select_experts(logits, TopKRouting(2, renormalize=False))
    probs = torch.softmax(logits, -1)
    assert ids.tolist() == [[3, 2]]
    assert torch.allclose(weights, probs[:, [3, 2]])
    weights, _ = select_experts(logits, TopKRouting(2, renormalize=True))
    assert torch.allclose(weights.sum(-1), torch.ones(1)) and weights.dtype == torch.float32


@pytest.mark.parametrize(("experts", "ranks", "counts"), [(8, 2, [4, 4]), (10, 4, [3, 3, 2, 2]), (3, 2, [2, 1])])
def test_expert_parallel_places_contiguous_runs_with_the_remainder_first(experts, ranks, counts):
    placements = [place_experts(experts, r, ranks, expert_parallel=True) for r in range(ranks)]
    assert [p.num_local_experts for p in placements] == counts
    held = [e for p in placements for e in p.local_experts]
    assert held == list(range(experts))
    assert all(p.slice_count == 1 for p in placements)


def test_tensor_parallel_alone_keeps_every_expert_and_slices_each():
    placement = place_experts(8, 1, 2, expert_parallel=False)
    assert (placement.num_local_experts, placement.slice_rank, placement.slice_count) == (8, 1, 2)
    assert placement.is_complete


def test_expert_parallel_over_more_ranks_than_experts_is_refused_by_name():
    with pytest.raises(UnsupportedError, match=r"layers\.0\.mlp\.experts: enable_expert_parallel places whole "
                       r"experts on ranks, but tensor parallel size 8 is larger than num_experts=4"):
        place_experts(4, 0, 8, expert_parallel=True, what="layers.0.mlp.experts")


def test_expert_names_map_per_expert_all_expert_and_fused_tensors():
    names = ExpertNames("w1", "w2", "w3")
    assert names.target("model.layers.3.mlp.experts.11.w3.weight") == ExpertTarget(
        "model.layers.3.mlp.experts.w13_weight", "w3", 11)
    assert names.target("model.layers.3.mlp.experts.1.w2.qweight") == ExpertTarget(
        "model.layers.3.mlp.experts.w2_qweight", "w2", 1)
    assert names.target("model.layers.0.mlp.experts.w1.weight") == ExpertTarget(
        "model.layers.0.mlp.experts.w13_weight", "w1", None)
    assert names.target("model.layers.0.mlp.experts.gate_up_proj") == ExpertTarget(
        "model.layers.0.mlp.experts.w13_weight", None, None)
    assert names.target("model.layers.0.mlp.gate.weight") is None
    assert names.target("model.layers.0.mlp.shared_expert.gate_proj.weight") is None


def test_vllm_style_mapping_lists_every_part_of_every_expert():
    mapping = FusedMoE.make_expert_params_mapping("gate_proj", "down_proj", "up_proj", 2)
    assert ("experts.w13_", "experts.1.up_proj.", 1, "w3") in mapping
    assert ("experts.w2_", "experts.0.down_proj.", 0, "w2") in mapping
    assert len(mapping) == 6


def test_grouped_forward_equals_the_dense_definition():
    weights = _experts()
    layer = _layer(weights)
    x, logits = _inputs(7)
    expected = _reference(x, logits, weights)
    with torch.no_grad():
        assert torch.allclose(layer(x, logits), expected, rtol=1e-5, atol=1e-5 * float(expected.abs().max()))
    assert layer.loaded_parameters() == {"w13_weight", "w2_weight"}


def test_choices_held_elsewhere_are_skipped():
    x = torch.randn(3, 4)
    ids = torch.tensor([[0, -1], [-1, -1], [1, 0]])
    weights = torch.full((3, 2), 0.5)
    out = run_chosen_experts(x, weights, ids, 2, lambda e, rows: rows * (e + 1))
    assert torch.allclose(out, torch.stack([0.5 * x[0], torch.zeros(4), 0.5 * 2 * x[2] + 0.5 * x[2]]))


def test_a_three_dimensional_tensor_of_every_expert_loads_like_per_expert_tensors():
    weights = _experts()
    per_expert = _layer(weights)
    stacked = _layer()
    params = dict(stacked.named_parameters())
    for part, shard in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
        tensor = torch.stack([weights[f"{e}.{part}"] for e in range(EXPERTS)])
        param = params["w2_weight" if shard == "w2" else "w13_weight"]
        stacked.weight_loader(param, EagerTensor(tensor, f"blk.0.ffn_{part}_exps"), "", shard, None)
    assert torch.equal(stacked.w13_weight, per_expert.w13_weight)
    assert torch.equal(stacked.w2_weight, per_expert.w2_weight)


def test_fused_gate_up_tensor_splits_into_gate_then_up():
    weights = _experts()
    expected = _layer(weights)
    fused = _layer()
    tensor = torch.stack([torch.cat([weights[f"{e}.gate_proj"], weights[f"{e}.up_proj"]]) for e in range(EXPERTS)])
    fused.weight_loader(fused.w13_weight, EagerTensor(tensor, "experts.gate_up_proj"), "", None, None)
    assert torch.equal(fused.w13_weight, expected.w13_weight)


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_two_ranks_partial_outputs_sum_to_one_rank_output(expert_parallel):
    weights = _experts()
    x, logits = _inputs(5)
    full = _layer(weights)(x, logits)
    partial = []
    for rank in range(2):
        with simulated_tp(rank, 2, expert_parallel=expert_parallel):
            layer = _layer(weights)
        partial.append(layer(x, logits))
        assert layer.loaded_parameters() == {"w13_weight", "w2_weight"}
    assert torch.allclose(partial[0] + partial[1], full, rtol=1e-5, atol=1e-5 * float(full.abs().max()))


def test_expert_parallel_reads_only_this_ranks_experts():
    reads: list[str] = []
    with simulated_tp(1, 2, expert_parallel=True):
        layer = _layer()
    params = dict(layer.named_parameters())
    for key, tensor in _experts().items():
        name = f"model.layers.0.mlp.experts.{key}.weight"
        target = layer.names.target(name)
        recording = RecordingTensor(tensor, name)
        layer.weight_loader(params[target.param_name.rpartition(".")[2]], recording, name, target.shard_id,
                            target.expert_id)
        if recording.log:
            reads.append(key.split(".")[0])
    assert sorted(set(reads)) == ["2", "3"]


def test_tensor_parallel_reads_only_this_ranks_slice_of_each_expert():
    with simulated_tp(1, 2):
        layer = _layer()
    gate = RecordingTensor(torch.randn(INTER, HIDDEN), "experts.0.gate_proj.weight")
    down = RecordingTensor(torch.randn(HIDDEN, INTER), "experts.0.down_proj.weight")
    layer.weight_loader(layer.w13_weight, gate, "", "w1", 0)
    layer.weight_loader(layer.w2_weight, down, "", "w2", 0)
    assert gate.log == [((INTER // 2, INTER // 2), (0, HIDDEN))]
    assert down.log == [((0, HIDDEN), (INTER // 2, INTER // 2))]
    assert torch.equal(layer.w13_weight[0, : INTER // 2], gate.base[INTER // 2:])


def test_an_expert_missing_from_the_checkpoint_is_named():
    layer = _layer()
    _load(layer, _experts(), skip="2.up_proj")
    with pytest.raises(MissingWeightsError, match=r"the experts 'mlp\.experts' \(num_experts=4\) lack "
                       r"'mlp\.experts\.2\.up_proj\.weight' in the checkpoint"):
        layer.loaded_parameters()


def test_an_expert_id_out_of_range_names_the_tensor_and_the_config():
    layer = _layer()
    name = "model.layers.0.mlp.experts.4.gate_proj.weight"
    with pytest.raises(UnexpectedWeightError, match=r"tensor 'model\.layers\.0\.mlp\.experts\.4\.gate_proj\.weight'"
                       r".*: expert 4 is out of range, the config says num_experts=4 \(experts 0\.\.3\)"):
        layer.weight_loader(layer.w13_weight, EagerTensor(torch.zeros(INTER, HIDDEN), name), name, "w1", 4)


def test_a_three_dimensional_tensor_with_the_wrong_expert_count_is_named():
    layer = _layer()
    tensor = EagerTensor(torch.zeros(EXPERTS + 1, INTER, HIDDEN), "blk.0.ffn_gate_exps.weight")
    with pytest.raises(ShapeMismatchError, match=r"blk\.0\.ffn_gate_exps\.weight.*needs 4 experts \(num_experts\) "
                       r"along dim 0 and 3 dimensions, found shape \(5, 8, 16\)"):
        layer.weight_loader(layer.w13_weight, tensor, "", "w1", None)


def test_a_per_expert_tensor_of_the_wrong_shape_is_named():
    layer = _layer()
    tensor = EagerTensor(torch.zeros(INTER + 1, HIDDEN), "model.layers.0.mlp.experts.0.gate_proj.weight")
    with pytest.raises(ShapeMismatchError, match=r"experts\.0\.gate_proj\.weight"):
        layer.weight_loader(layer.w13_weight, tensor, "", "w1", 0)


def test_an_intermediate_size_tensor_parallelism_cannot_split_is_named():
    with simulated_tp(0, 3), pytest.raises(UnsupportedError, match=r"mlp\.experts: moe_intermediate_size=8 is "
                                                                  r"not divisible by tensor parallel size 3"):
        _layer()
