"""GGUF -> HF tensor names come from gguf-py's tables; unknown names are refused by name."""

from __future__ import annotations

import pytest

from loader.errors import UnexpectedWeightError, UnsupportedError
from loader_plugin_gguf.format.names import HF_MODULES, gguf_arch, name_mapper


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_every_llama_family_module_maps_back_from_its_gguf_name(arch):
    mapper = name_mapper(arch, 3)
    expected = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight",
        "blk.2.attn_norm.weight": "model.layers.2.input_layernorm.weight",
        "blk.2.attn_q.weight": "model.layers.2.self_attn.q_proj.weight",
        "blk.0.attn_k.bias": "model.layers.0.self_attn.k_proj.bias",
        "blk.1.attn_v.weight": "model.layers.1.self_attn.v_proj.weight",
        "blk.1.attn_output.weight": "model.layers.1.self_attn.o_proj.weight",
        "blk.1.ffn_norm.weight": "model.layers.1.post_attention_layernorm.weight",
        "blk.0.ffn_gate.weight": "model.layers.0.mlp.gate_proj.weight",
        "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight",
        "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
    }
    assert {g: mapper.hf_name(g, "f.gguf") for g in expected} == expected


def test_qk_norms_exist_only_for_qwen3():
    assert name_mapper("qwen3", 1).hf_name("blk.0.attn_q_norm.weight", "f.gguf") == \
        "model.layers.0.self_attn.q_norm.weight"
    with pytest.raises(UnexpectedWeightError,
                       match=r"tensor 'blk\.0\.attn_k_norm\.weight' in f\.gguf: no 'qwen2' model parameter"):
        name_mapper("qwen2", 1).hf_name("blk.0.attn_k_norm.weight", "f.gguf")


def test_unknown_tensor_is_refused_by_name():
    with pytest.raises(UnexpectedWeightError,
                       match=r"tensor 'blk\.0\.ffn_gate_shexp\.weight' in f\.gguf: no 'llama' model parameter"):
        name_mapper("llama", 1).hf_name("blk.0.ffn_gate_shexp.weight", "f.gguf")


def test_block_beyond_block_count_is_refused():
    with pytest.raises(UnexpectedWeightError, match=r"'blk\.4\.attn_q\.weight' .* \(block 4 of 4\)"):
        name_mapper("llama", 4).hf_name("blk.4.attn_q.weight", "f.gguf")


def test_rotary_tables_are_skipped_not_mapped():
    mapper = name_mapper("llama", 1)
    assert mapper.is_skipped("rope_freqs.weight")
    assert mapper.is_skipped("blk.0.attn_rot_embd")
    assert not mapper.is_skipped("blk.0.attn_q.weight")


def test_mapping_comes_from_gguf_py_for_every_hf_module():
    """Nothing is hard-coded on the GGUF side: each entry is gguf-py's answer for an HF module."""
    import gguf

    table = gguf.get_tensor_name_map(gguf_arch("qwen3"), 1)
    mapper = name_mapper("qwen3", 1)
    for hf in HF_MODULES:
        gguf_name = table.get_name(hf.format(bid=0))
        assert gguf_name is not None
        assert mapper.hf_name(gguf_name + ".weight", "f") == hf.format(bid=0) + ".weight"


def test_unknown_architecture_is_refused():
    with pytest.raises(UnsupportedError, match="GGUF architecture 'nonesuch' is unknown to gguf-py"):
        gguf_arch("nonesuch")


@pytest.mark.parametrize(("arch", "gate", "gate_exps", "shared"), [
    ("llama", "block_sparse_moe.gate", "block_sparse_moe.experts.w1", None),
    ("qwen2moe", "mlp.gate", "mlp.experts.gate_proj", "mlp.shared_expert_gate"),
    ("qwen3moe", "mlp.gate", "mlp.experts.gate_proj", None),
])
def test_expert_tensors_take_each_architectures_hf_names(arch, gate, gate_exps, shared):
    """Mixtral's own names for a llama file (its model renames block_sparse_moe to mlp), Qwen's for qwen*moe;
    the 3-D tensors keep no expert index (the weight stream splits them per expert)."""
    mapper = name_mapper(arch, 2)
    assert mapper.hf_name("blk.1.ffn_gate_inp.weight", "f.gguf") == f"model.layers.1.{gate}.weight"
    assert mapper.hf_name("blk.1.ffn_gate_exps.weight", "f.gguf") == f"model.layers.1.{gate_exps}.weight"
    if shared is not None:
        assert mapper.hf_name("blk.1.ffn_gate_inp_shexp.weight", "f.gguf") == f"model.layers.1.{shared}.weight"
