"""The mixture-of-experts fields of a GGUF file's config (:mod:`loader_plugin_gguf.format.moe_config`) and the
vector-stored one-row gate (:class:`~loader_plugin_gguf.format.experts.RowVector`)."""

from __future__ import annotations

import pytest
import torch

from loader.weights import EagerTensor
from loader_plugin_gguf.format.config import hf_config_of_files
from loader_plugin_gguf.format.experts import RowVector, per_expert_name
from tests.helpers.gguf_moe_files import write_moe_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config


@pytest.mark.parametrize(("family", "expected"), [
    ("mixtral", {"architectures": ["MixtralForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 2,
                 "intermediate_size": 32}),
    ("qwen2_moe", {"architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4, "moe_intermediate_size": 32,
                   "shared_expert_intermediate_size": 64, "norm_topk_prob": False, "mlp_only_layers": []}),
    ("qwen3_moe", {"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 4, "moe_intermediate_size": 32,
                   "norm_topk_prob": True}),
])
def test_expert_fields_as_llama_cpp_computes_them(tmp_path, family, expected):
    """No file stores norm_topk_prob: llama.cpp renormalises for llama and qwen3moe, not for qwen2moe."""
    overrides = {"mlp_only_layers": [], "shared_expert_intermediate_size": 64} if family == "qwen2_moe" else {}
    model = build_model(family, tiny_config(family, vocab_size=288, **overrides))
    config = hf_config_of_files([str(write_moe_gguf(tmp_path / "m.gguf", model, family))])
    assert {key: config[key] for key in expected} == expected


def test_a_vector_is_the_one_row_matrix_of_a_linear():
    vector = RowVector(EagerTensor(torch.arange(6.0), "g"))
    assert vector.shape == (1, 6)
    assert torch.equal(vector.narrow(1, 2, 3).read(), torch.tensor([[2.0, 3.0, 4.0]]))
    out = torch.empty(1, 6)
    vector.read_into(out)
    assert torch.equal(out, torch.arange(6.0).view(1, 6))


def test_per_expert_names_are_the_ones_transformers_writes():
    assert per_expert_name("model.layers.2.mlp.experts.up_proj.weight", 7) == \
        "model.layers.2.mlp.experts.7.up_proj.weight"
    assert per_expert_name("model.layers.0.block_sparse_moe.experts.w2.weight", 3) == \
        "model.layers.0.block_sparse_moe.experts.3.w2.weight"
