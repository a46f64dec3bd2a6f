"""load_weights on a model built in-process: the stacked mapping, skips, tied heads and TP shards."""

from __future__ import annotations

import pytest
import torch

from loader._distributed import simulated_tp
from loader.errors import UnexpectedWeightError, UnsupportedError
from loader.weights import EagerTensor
from loader_plugin_llama.model import LlamaForCausalLM
from tests.helpers.eager_checkpoint import build_model, eager_weights
from tests.helpers.model_checks import write_family_checkpoint


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-weights")
    reference = write_family_checkpoint("llama", path)
    return path, {name: t.detach().clone() for name, t in reference.state_dict().items()}


def _all_names(model):
    return {name for name, _ in model.named_parameters()}


def test_fills_every_parameter_and_skips_rotary_tables(checkpoint):
    path, hf = checkpoint
    model = build_model(LlamaForCausalLM, path)
    extra = [(f"model.layers.0.self_attn.rotary_emb.{n}", EagerTensor(torch.ones(8), name=n))
             for n in ("inv_freq", "cos_cached", "sin_cached")]
    with torch.no_grad():
        filled = model.load_weights([*eager_weights(path), *extra])
    assert filled == _all_names(model)
    qkv = model.model.layers[1].self_attn.qkv_proj.weight
    prefix = "model.layers.1.self_attn"
    expected = torch.cat([hf[f"{prefix}.{p}_proj.weight"] for p in "qkv"])
    assert torch.equal(qkv, expected)
    gate_up = model.model.layers[0].mlp.gate_up_proj.weight
    assert torch.equal(gate_up, torch.cat([hf["model.layers.0.mlp.gate_proj.weight"],
                                           hf["model.layers.0.mlp.up_proj.weight"]]))


def test_unknown_tensor_is_rejected_by_name(checkpoint):
    path, _ = checkpoint
    model = build_model(LlamaForCausalLM, path)
    stray = EagerTensor(torch.zeros(2), name="model.layers.0.mlp.bias_thing", file="shard-7.safetensors")
    with pytest.raises(UnexpectedWeightError, match=r"'model\.layers\.0\.mlp\.bias_thing' in shard-7"):
        model.load_weights([("model.layers.0.mlp.bias_thing", stray)])


def test_tied_head_skips_lm_head_and_reports_it_filled(checkpoint):
    path, hf = checkpoint
    model = build_model(LlamaForCausalLM, path, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in _all_names(model)  # deduplicated by named_parameters
    decoy = EagerTensor(torch.full((256, 64), 7.0), name="lm_head.weight")
    with torch.no_grad():
        filled = model.load_weights([*eager_weights(path), ("lm_head.weight", decoy)])
    assert _all_names(model) <= filled
    assert "lm_head.weight" in filled
    assert torch.equal(model.lm_head.weight, hf["model.embed_tokens.weight"])


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_holds_its_heads_and_rows(tmp_path, rank, kv_heads):
    reference = write_family_checkpoint("llama", tmp_path, num_key_value_heads=kv_heads)
    hf = reference.state_dict()
    with simulated_tp(rank, 2):
        model = build_model(LlamaForCausalLM, tmp_path)
        with torch.no_grad():
            filled = model.load_weights(eager_weights(tmp_path))
    assert filled == _all_names(model)
    attn = model.model.layers[0].self_attn
    assert attn.num_heads == 2 and attn.num_kv_heads == 1
    head_dim = 16
    q_rows = slice(rank * 2 * head_dim, (rank + 1) * 2 * head_dim)
    kv_head = rank if kv_heads == 2 else 0  # one KV head: both ranks hold a replica
    kv_rows = slice(kv_head * head_dim, (kv_head + 1) * head_dim)
    prefix = "model.layers.0.self_attn"
    expected = torch.cat([hf[f"{prefix}.q_proj.weight"][q_rows], hf[f"{prefix}.k_proj.weight"][kv_rows],
                          hf[f"{prefix}.v_proj.weight"][kv_rows]])
    assert torch.equal(attn.qkv_proj.weight, expected)
    assert torch.equal(attn.o_proj.weight, hf[f"{prefix}.o_proj.weight"][:, q_rows])
    assert torch.equal(model.lm_head.weight, hf["lm_head.weight"][rank * 128:(rank + 1) * 128])


@pytest.mark.parametrize(
    ("changes", "tp", "message"),
    [
        ({}, 3, "num_attention_heads=4 is not divisible by tensor parallel size 3"),
        ({"num_attention_heads": 12, "num_key_value_heads": 3, "head_dim": 8}, 4,
         "num_key_value_heads=3 and tensor parallel size 4 do not divide"),
        ({"num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 8, "intermediate_size": 100}, 8,
         "intermediate_size=100 is not divisible by tensor parallel size 8"),
    ],
)
def test_tensor_parallel_size_that_cannot_split_the_model_is_refused(checkpoint, changes, tp, message):
    path, _ = checkpoint
    with simulated_tp(0, tp), pytest.raises(UnsupportedError, match=message):
        build_model(LlamaForCausalLM, path, **changes)


def test_construction_on_meta_computes_nothing(checkpoint):
    path, _ = checkpoint
    with torch.device("meta"):
        model = build_model(LlamaForCausalLM, path)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert all(b.device.type == "meta" for b in model.buffers())
