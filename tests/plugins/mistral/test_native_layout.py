"""Mistral's native layout: names mapped, q/k rows un-interleaved, logits equal to the HF twin."""

from __future__ import annotations

import pytest
import torch

from loader._context import ModelContext
from loader._distributed import simulated_tp
from loader.checkpoint import Source
from loader_plugin_mistral.model import MistralForCausalLM
from loader_plugin_mistral.native_config import read_native_config
from loader_plugin_mistral.native_layout import NativeNames, native_to_hf_name, native_weight_format
from tests.helpers.eager_checkpoint import build_model, eager_weights
from tests.helpers.hf_checkpoints import build_model as build_hf_model
from tests.helpers.hf_checkpoints import tiny_config
from tests.helpers.mistral_native import save_native_checkpoint
from tests.helpers.model_checks import assert_logits_match, load


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """One random Mistral model written twice: native layout and Hugging Face layout."""
    root = tmp_path_factory.mktemp("mistral-twins")
    reference = build_hf_model("mistral", tiny_config("mistral", num_key_value_heads=2))
    save_native_checkpoint(reference, root / "native")
    reference.save_pretrained(root / "hf", max_shard_size="40KB")
    return root / "native", root / "hf", reference


@pytest.mark.parametrize(
    ("native", "expected"),
    [
        ("tok_embeddings.weight", ("model.embed_tokens.weight", None)),
        ("norm.weight", ("model.norm.weight", None)),
        ("output.weight", ("lm_head.weight", None)),
        ("layers.3.attention.wq.weight", ("model.layers.3.self_attn.q_proj.weight", "q")),
        ("layers.3.attention.wk.weight", ("model.layers.3.self_attn.k_proj.weight", "k")),
        ("layers.3.attention.wv.weight", ("model.layers.3.self_attn.v_proj.weight", None)),
        ("layers.3.attention.wo.weight", ("model.layers.3.self_attn.o_proj.weight", None)),
        ("layers.0.attention_norm.weight", ("model.layers.0.input_layernorm.weight", None)),
        ("layers.0.ffn_norm.weight", ("model.layers.0.post_attention_layernorm.weight", None)),
        ("layers.0.feed_forward.w1.weight", ("model.layers.0.mlp.gate_proj.weight", None)),
        ("layers.0.feed_forward.w2.weight", ("model.layers.0.mlp.down_proj.weight", None)),
        ("layers.0.feed_forward.w3.weight", ("model.layers.0.mlp.up_proj.weight", None)),
        ("layers.0.attention.wz.weight", ("layers.0.attention.wz.weight", None)),
    ],
)
def test_native_names_map_to_hugging_face_names(native, expected):
    assert native_to_hf_name(native) == expected


def test_native_folder_logits_equal_the_hugging_face_twin(twins):
    native, _, reference = twins
    detected = native_weight_format(Source(str(native), native), "auto")
    assert detected is not None and isinstance(detected.renaming, NativeNames)
    assert_logits_match(load(native), reference)


def test_a_hugging_face_folder_is_not_native(twins):
    _, hf, _ = twins
    assert native_weight_format(Source(str(hf), hf), "auto") is None


def test_native_folder_in_bfloat16(twins):
    native, _, reference = twins
    assert_logits_match(load(native, "bfloat16"), reference, dtype=torch.bfloat16)


def test_unknown_native_tensor_is_named(twins, tmp_path):
    native, _, _ = twins
    config = read_native_config(native)
    model = MistralForCausalLM(ModelContext(hf_config=config, dtype=torch.float32))
    from loader.errors import UnexpectedWeightError
    from loader.weights import EagerTensor

    stray = EagerTensor(torch.zeros(2), name="layers.0.attention.wz.weight", file="consolidated.safetensors")
    with pytest.raises(UnexpectedWeightError, match=r"'layers\.0\.attention\.wz\.weight' in consolidated"):
        model.load_weights([("layers.0.attention.wz.weight", stray)])


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_of_a_native_load_equals_the_same_rank_from_hf(twins, rank):
    native, hf, _ = twins
    native_config = read_native_config(native)
    with simulated_tp(rank, 2):
        from_native = MistralForCausalLM(ModelContext(hf_config=native_config, dtype=torch.float32))
        from_hf = build_model(MistralForCausalLM, hf)
        with torch.no_grad():
            from_native.load_weights(NativeNames()(iter(eager_weights(native)), native_config))
            from_hf.load_weights(eager_weights(hf))
    native_params = dict(from_native.named_parameters())
    for name, param in from_hf.named_parameters():
        assert torch.equal(native_params[name], param), name


def test_a_native_tensor_and_its_hugging_face_twin_are_refused(twins, tmp_path):
    """Both names land on one parameter after renaming: a duplicate, not last-one-wins."""
    import shutil

    from safetensors.torch import load_file, save_file

    from loader.errors import CheckpointFormatError

    native, _, _ = twins
    folder = tmp_path / "both"
    shutil.copytree(native, folder)
    tensors = load_file(str(folder / "consolidated.safetensors"))
    tensors["model.layers.0.self_attn.q_proj.weight"] = torch.zeros_like(tensors["layers.0.attention.wq.weight"])
    save_file(tensors, str(folder / "consolidated.safetensors"))
    with pytest.raises(CheckpointFormatError) as info:
        load(folder)
    file = folder / "consolidated.safetensors"
    assert sorted(str(info.value).removeprefix("tensor 'model.layers.0.self_attn.q_proj.weight' appears twice: in ")
                  .split(" and in ")) == [f"{file}", f"{file} (stored as 'layers.0.attention.wq.weight')"]


@pytest.mark.parametrize("name", ["consolidated.safetensors.index.json", "consolidated.safetensors"])
def test_a_native_file_linking_out_of_the_folder_is_refused_by_name(twins, tmp_path, name):
    """The native layout's files follow the core's folder rule: a link out of the folder is refused before reading."""
    import shutil

    from loader.errors import LoadError

    native, _, _ = twins
    folder = tmp_path / "native"
    shutil.copytree(native, folder)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    target = folder / name
    if not target.exists():  # the twin has no index: make one that names the single file
        target.write_text('{"weight_map": {}}')
    moved = outside / name
    shutil.move(target, moved)
    target.symlink_to(moved)
    with pytest.raises(LoadError, match=f"{name}.* resolves to .*outside the model folder"):
        load(folder)
