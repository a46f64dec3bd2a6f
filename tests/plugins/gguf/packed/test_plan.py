"""``loader inspect --layers`` plans every GGUF layer from the header: the load's own records, before loading.

Each file mixes block types so that every way a layer is decided shows up:
packed (Q4_0, Q4_1, Q4_K, mixed within one fused layer), a type with no packed
kernel (Q6_K, F16), parts needing different kernels (Q8_0's int4x2 beside Q4
in one fused layer: a segment each), output features that are not a multiple of 16, a TP split
cutting a 32-value group, and the embedding (int8 codes for Q8_0, blocks plus
the tied head's int4 for Q4_1).
"""

from __future__ import annotations

import json

import pytest
import torch

import loader
from loader._pipeline.plan import plan_layers
from loader.testing import simulated_tp
from tests.core.test_cli import run_cli
from tests.helpers.gguf_files import Q, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config

MIXED_TYPES = {
    "blk.0.attn_q.weight": Q.Q4_K,
    "blk.0.attn_k.weight": Q.Q4_0,
    "blk.0.attn_output.weight": Q.Q6_K,
    "blk.1.attn_v.weight": Q.Q8_0,
    "blk.1.ffn_gate.weight": Q.Q4_K,
    "blk.0.ffn_down.weight": Q.F16,  # 36 input features: no 32-value block type fits the rows
    "blk.1.ffn_down.weight": Q.F16,
    "token_embd.weight": Q.Q8_0,
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """hidden 256 (a Q4_K super-block per row), intermediate 36 (gate/up: 72 output features), Q4_1 elsewhere."""
    config = tiny_config("llama", vocab_size=288, rope_scaling=None, hidden_size=256, intermediate_size=36)
    folder = tmp_path_factory.mktemp("plan")
    return write_gguf(folder / "mixed.gguf", build_model("llama", config), "llama", qtype=Q.Q4_1,
                      tensor_types=MIXED_TYPES)


def test_inspect_plans_each_layer_exactly_as_the_load_records_it(mixed):
    planned = run_cli("inspect", str(mixed), "--layers", "--json")
    assert planned.returncode == 0, planned.stderr
    loaded = run_cli("load", str(mixed), "--json")
    assert loaded.returncode == 0, loaded.stderr
    plan = json.loads(planned.stdout)["layers"]
    records = json.loads(loaded.stdout)["quantization"]["layers"]
    assert plan == records
    assert plan["model.layers.0.self_attn.qkv_proj"] == {
        "kernel": "int4", "types": ["Q4_K", "Q4_0", "Q4_1"], "packed_bytes": 512 * 256 // 2 + 8 * 512 * 2 * 2,
        "reason": None, "dtype": None, "paths_from": "static",
        "by_tokens": {"float32": dict.fromkeys(("1", "2-16", "17-64", "65-256", "257+"), "packed-bf16")}}
    assert plan["model.layers.0.self_attn.o_proj"]["reason"] == "ggml type Q6_K has no packed int4 kernel"
    # q and k on the int4 kernel, v (Q8_0) beside them as two int4 planes: one segment each, both packed
    assert plan["model.layers.1.self_attn.qkv_proj"] == {
        "kernel": "int4+int4x2", "types": ["Q4_1", "Q4_1", "Q8_0"], "reason": None, "dtype": None,
        "packed_bytes": (384 * 256 // 2 + 8 * 384 * 2 * 2) + (2 * 128 * 256 // 2 + 8 * 2 * 128 * 2 * 2),
        "paths_from": "static",  # each packed segment planned as a layer of its kernel
        "by_tokens": {"float32": dict.fromkeys(("1", "2-16", "17-64", "65-256", "257+"), "packed-bf16")}}
    assert plan["model.layers.0.self_attn.o_proj"]["dtype"] == "bfloat16"  # dtype auto: the kernel's, not float32
    assert plan["model.layers.0.mlp.down_proj"]["reason"] == "ggml type F16 has no packed int4 kernel"
    assert plan["model.layers.0.mlp.down_proj"]["dtype"] == "float32"  # a float tensor keeps the load's dtype
    assert plan["model.layers.1.mlp.gate_up_proj"] == {
        "kernel": "dequantized", "types": ["Q4_K", "Q4_1"], "packed_bytes": 0,
        "reason": "output features 72 are not a multiple of 16", "dtype": "bfloat16"}
    assert plan["model.layers.1.self_attn.o_proj"]["kernel"] == "int4"
    assert plan["model.embed_tokens"]["kernel"] == "int8"  # lookups alone: the head is untied


def test_the_text_table_lists_each_layer_s_block_types(mixed):
    text = run_cli("inspect", str(mixed), "--layers")
    assert text.returncode == 0, text.stderr
    assert ("kernels on cpu (planned from shapes; no weights read): dequantized 5, int4 2, int8 1, int4+int4x2 1, "
            "blocks+int4 1" in text.stdout)  # blocks+int4: the untied output head
    assert "  dequantized (2 layers): output features 72 are not a multiple of 16" in text.stdout
    row = next(line for line in text.stdout.splitlines() if line.startswith("model.layers.1.self_attn.qkv_proj"))
    assert row.split()[1:] == ["int4+int4x2", "Q4_1,", "Q4_1,", "Q8_0", "102400", "float32:", "packed-bf16",
                               "static"]  # each packed segment planned: the segments' paths joined
    row = next(line for line in text.stdout.splitlines() if line.startswith("model.layers.0.self_attn.qkv_proj"))
    assert row.split()[1:] == ["int4", "Q4_K,", "Q4_0,", "Q4_1", str(512 * 256 // 2 + 8 * 512 * 2 * 2),
                               "float32:", "packed-bf16", "static"]
    assert "decided at load" not in text.stdout


def test_a_tied_q4_embedding_plans_blocks_and_the_head_s_int4(tmp_path):
    path = write_gguf(tmp_path / "tied.gguf", build_model("qwen2", tiny_config("qwen2", vocab_size=288)), "qwen2",
                      qtype=Q.Q4_1)
    plan = plan_layers(str(path))["layers"]
    _, report = loader.load_model_with_report(str(path))
    assert plan == report.quantization["layers"]
    assert plan["model.embed_tokens"]["kernel"] == "blocks+int4"


@pytest.mark.parametrize("rank", [0, 1])
def test_each_tp_rank_plans_its_own_share(tmp_path, rank):
    """tp=2: down_proj's 96 input features give each rank 48, which would cut a Q4_0 group, so each rank keeps
    32 of its 64 output rows over all 96 (packed); gate/up keep their rows."""
    config = tiny_config("llama", vocab_size=288, rope_scaling=None, intermediate_size=96)
    path = write_gguf(tmp_path / "tp.gguf", build_model("llama", config), "llama", qtype=Q.Q4_0)
    with simulated_tp(rank, 2):
        plan = plan_layers(str(path))["layers"]
        _, report = loader.load_model_with_report(str(path))
    assert plan == report.quantization["layers"]
    assert plan["model.layers.0.mlp.down_proj"]["kernel"] == "int4"
    assert plan["model.layers.0.mlp.down_proj"]["packed_bytes"] == 32 * 96 // 2 + 3 * 32 * 2 * 2
    assert plan["model.layers.0.mlp.gate_up_proj"]["packed_bytes"] == 96 * 64 // 2 + 2 * 96 * 2 * 2


@pytest.mark.parametrize("rank", [0, 1])
def test_a_row_parallel_layer_neither_half_of_which_packs_is_dequantized_keeping_its_rows(tmp_path, rank):
    """down_proj 80 x 96 at tp=2: 40 rows a rank are no multiple of 16 and 48 columns cut a Q4_0 group, so the
    plan and the load both dequantize this rank's 40 rows over all 96 columns and say why for each split."""
    config = tiny_config("llama", vocab_size=288, hidden_size=80, intermediate_size=96, rope_scaling=None)
    path = write_gguf(tmp_path / "neither.gguf", build_model("llama", config), "llama", qtype=Q.F16,
                      quantized_as={"blk.0.ffn_down.weight": Q.Q4_0})
    with simulated_tp(rank, 2):
        plan = plan_layers(str(path))["layers"]
        shard, report = loader.load_model_with_report(str(path))
    assert plan == report.quantization["layers"]
    assert plan["model.layers.0.mlp.down_proj"]["reason"] == (
        "this rank's rows: output features 40 are not a multiple of 16; "
        "its columns: the tensor parallel split cuts a 32-value group")
    down = dict(shard.named_modules())["model.layers.0.mlp.down_proj"].weight
    dense = dict(loader.load_model(str(path), dtype="float32").named_modules())["model.layers.0.mlp.down_proj"]
    assert torch.equal(down, dense.weight[40 * rank:40 * (rank + 1)].to(torch.bfloat16))


def test_a_forced_dequantize_load_plans_no_gguf_layers(mixed):
    """float32 asked for by name dequantizes at load, so the plan shows dense layers (the load records none)."""
    plan = plan_layers(str(mixed), dtype="float32")
    assert plan["quantization"] is None
    assert {record["kernel"] for record in plan["layers"].values()} == {"dense"}


@pytest.mark.needs_plugins
def test_the_transformers_fallback_plans_under_the_names_its_load_records(tmp_path):
    """The fallback nests loader's linears under ``hf_model.``; plan and load both key a layer by its prefix."""
    pytest.importorskip("loader_plugin_transformers", reason="the fallback is another plugin")
    config = tiny_config("llama", vocab_size=288, rope_scaling=None)
    path = write_gguf(tmp_path / "fallback.gguf", build_model("llama", config), "llama", qtype=Q.Q4_1,
                      tensor_types={"blk.0.attn_v.weight": Q.Q8_0})
    plan = plan_layers(str(path), model_impl="transformers")["layers"]
    _, report = loader.load_model_with_report(str(path), model_impl="transformers")
    assert plan == report.quantization["layers"]
    # the fallback's unfused v_proj alone is Q8_0: its codes as two int4 planes
    assert plan["model.layers.0.self_attn.v_proj"]["kernel"] == "int4x2"


def test_a_plan_maps_no_tensor_data(mixed, monkeypatch):
    """Planned from the header alone: the file's data is never mapped (a load maps it on the first block read)."""
    from loader_plugin_gguf.format.tensors import MappedFile

    def refuse(self):
        raise AssertionError(f"{self.path}: tensor data mapped while planning")

    monkeypatch.setattr(MappedFile, "bytes", refuse)
    plan = plan_layers(str(mixed))["layers"]
    assert all(record is not None for record in plan.values())
