"""transformers' checkpoint conversions in the fallback: fused experts, renamed heads, and their bad input.

The checkpoints are written by ``save_pretrained``, so they hold what
transformers writes (per-expert ``experts.E.w1/w2/w3`` or
``gate_proj/up_proj/down_proj``, GPT-NeoX's ``embed_out``), and the fallback
must apply transformers' conversions to load them (forced with
``model_impl="transformers"``, whatever native plugins are installed).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader._distributed import simulated_tp
from loader.errors import LoadError, MissingWeightsError, ShapeMismatchError, UnsupportedError
from loader.models import current_session
from tests.helpers.hf_fallback_checkpoints import reference_logits, save_fallback_checkpoint

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64], [5, 6, 7, 8, 9, 10, 11, 12]])
_DECODER = dict(hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, vocab_size=256)
MOE_FAMILIES: dict[str, dict[str, object]] = {
    "mixtral": dict(_DECODER, num_local_experts=4, num_experts_per_tok=2),
    "qwen2_moe": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48),
    "qwen3_moe": dict(_DECODER, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, head_dim=16),
    "gpt_neox": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=256),
}
"""model_type -> tiny config overrides (tp-friendly: heads, KV heads and expert rows divisible by 2)."""


def _load(folder, **kwargs):
    return loader.load_model(str(folder), dtype="float32", model_impl="transformers", **kwargs)


def _one_line(exc: pytest.ExceptionInfo[LoadError]) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def _rewrite(folder, edit) -> None:
    """Edit the checkpoint's tensors, written back as one ``model.safetensors`` (shards and index removed)."""
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
        shard.unlink()
    (folder / "model.safetensors.index.json").unlink(missing_ok=True)
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("model_type", sorted(MOE_FAMILIES))
def test_logits_equal_transformers(tmp_path, model_type):
    reference = save_fallback_checkpoint(tmp_path, model_type, **MOE_FAMILIES[model_type])
    model = _load(tmp_path)
    with torch.no_grad():
        torch.testing.assert_close(model(IDS), reference_logits(reference, IDS), atol=1e-5, rtol=0)


def test_experts_are_stacked_as_transformers_stacks_them(tmp_path):
    reference = save_fallback_checkpoint(tmp_path, "mixtral", **MOE_FAMILIES["mixtral"])
    written: dict[str, torch.Tensor] = {}
    _rewrite(tmp_path, written.update)
    assert "model.layers.1.block_sparse_moe.experts.3.w3.weight" in written  # per expert on disk
    model = _load(tmp_path)
    experts = model.hf_model.model.layers[1].mlp.experts
    torch.testing.assert_close(experts.gate_up_proj, reference.model.layers[1].mlp.experts.gate_up_proj)
    up = written["model.layers.1.block_sparse_moe.experts.3.w3.weight"]
    torch.testing.assert_close(experts.gate_up_proj[3, up.shape[0]:], up)  # gate rows first, then up
    torch.testing.assert_close(experts.down_proj[2], written["model.layers.1.block_sparse_moe.experts.2.w2.weight"])


def test_a_missing_expert_is_named(tmp_path):
    save_fallback_checkpoint(tmp_path, "qwen3_moe", **MOE_FAMILIES["qwen3_moe"])
    _rewrite(tmp_path, lambda t: t.pop("model.layers.1.mlp.experts.2.up_proj.weight"))
    with pytest.raises(MissingWeightsError) as exc:
        _load(tmp_path)
    assert _one_line(exc) == (
        "the checkpoint has no tensor for expert 2 ('model.layers.1.mlp.experts.2.up_proj.weight'), which "
        "transformers' Qwen3MoeForCausalLM fuses into model.layers.1.mlp.experts.gate_up_proj"
    )


def test_an_expert_of_the_wrong_shape_is_named(tmp_path):
    save_fallback_checkpoint(tmp_path, "mixtral", **MOE_FAMILIES["mixtral"])
    _rewrite(tmp_path, lambda t: t.update({"model.layers.0.block_sparse_moe.experts.2.w1.weight": torch.zeros(64, 65)}))
    with pytest.raises(ShapeMismatchError) as exc:
        _load(tmp_path)
    assert _one_line(exc).endswith(
        ": expected shape (64, 64) (the shape of 'model.layers.0.block_sparse_moe.experts.0.w1.weight') for "
        "model.layers.0.mlp.experts.gate_up_proj, found (64, 65)"
    )
    assert "'model.layers.0.block_sparse_moe.experts.2.w1.weight'" in str(exc.value)


def test_experts_that_disagree_with_the_config_are_named(tmp_path):
    save_fallback_checkpoint(tmp_path, "mixtral", **MOE_FAMILIES["mixtral"])
    config = json.loads((tmp_path / "config.json").read_text())
    config["intermediate_size"] = 32
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ShapeMismatchError) as exc:
        _load(tmp_path)
    assert "the inputs of model.layers.0.mlp.experts.down_proj make shape (4, 64, 64), and transformers' " \
           "MixtralForCausalLM expects (4, 64, 32)" in _one_line(exc)


def test_an_expert_beyond_the_configured_count_is_named(tmp_path):
    save_fallback_checkpoint(tmp_path, "mixtral", **MOE_FAMILIES["mixtral"])
    _rewrite(tmp_path, lambda t: t.update({"model.layers.0.block_sparse_moe.experts.4.w2.weight": torch.zeros(64, 64)}))
    with pytest.raises(LoadError, match=r"experts\.4\.w2\.weight.*expert 4 is out of range for "
                                        r"model\.layers\.0\.mlp\.experts\.down_proj, which holds 4 experts"):
        _load(tmp_path)


def test_expert_parallel_is_refused_by_the_fallback(tmp_path):
    save_fallback_checkpoint(tmp_path, "mixtral", **MOE_FAMILIES["mixtral"])
    with simulated_tp(0, 2), pytest.raises(UnsupportedError) as exc:
        _load(tmp_path, enable_expert_parallel=True)
    assert "enable_expert_parallel" in _one_line(exc)
    assert current_session().tp_size == 1
