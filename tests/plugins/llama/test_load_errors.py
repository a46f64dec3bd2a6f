"""A damaged Llama checkpoint fails fast with a message naming the tensor, shape or shard at fault."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from loader.errors import (
    LoadError,
    MissingWeightsError,
    ShapeMismatchError,
    UnexpectedWeightError,
)
from tests.helpers.model_checks import load, write_family_checkpoint

INDEX = "model.safetensors.index.json"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    path = tmp_path_factory.mktemp("llama-pristine")
    write_family_checkpoint("llama", path)
    return path


@pytest.fixture
def checkpoint(pristine, tmp_path):
    """A private copy of the pristine checkpoint, free to damage."""
    copy = tmp_path / "ckpt"
    shutil.copytree(pristine, copy)
    return copy


def _shard_of(path: Path, name: str) -> Path:
    return path / json.loads((path / INDEX).read_text())["weight_map"][name]


def _edit_shard(path: Path, name: str, change) -> None:
    """Apply ``change(tensors)`` to the shard holding ``name`` and keep the index in step."""
    shard = _shard_of(path, name)
    tensors = load_file(str(shard))
    change(tensors)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    index = json.loads((path / INDEX).read_text())
    index["weight_map"] = {n: f for n, f in index["weight_map"].items() if f != shard.name}
    index["weight_map"].update({n: shard.name for n in tensors})
    (path / INDEX).write_text(json.dumps(index))


def test_missing_tensor_names_the_parameter(checkpoint):
    _edit_shard(checkpoint, "model.layers.1.mlp.down_proj.weight",
                lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    with pytest.raises(MissingWeightsError, match=re.escape("model.layers.1.mlp.down_proj.weight")):
        load(checkpoint)


def test_missing_part_of_a_fused_parameter_names_the_checkpoint_tensor(checkpoint):
    _edit_shard(checkpoint, "model.layers.0.self_attn.k_proj.weight",
                lambda t: t.pop("model.layers.0.self_attn.k_proj.weight"))
    with pytest.raises(MissingWeightsError) as info:
        load(checkpoint)
    assert "'model.layers.0.self_attn.qkv_proj.weight'" in str(info.value)
    assert "'model.layers.0.self_attn.k_proj.weight' is missing" in str(info.value)


def test_unexpected_tensor_is_named(checkpoint):
    def add(tensors):
        tensors["model.layers.0.self_attn.extra_proj.weight"] = torch.zeros(4, 4)

    _edit_shard(checkpoint, "model.norm.weight", add)
    stray = re.escape("'model.layers.0.self_attn.extra_proj.weight'")
    with pytest.raises(UnexpectedWeightError, match=stray):
        load(checkpoint)


def test_shape_mismatch_names_tensor_expected_and_found_shapes(checkpoint):
    def shrink(tensors):
        tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(128, 32)

    _edit_shard(checkpoint, "model.layers.0.mlp.up_proj.weight", shrink)
    with pytest.raises(ShapeMismatchError) as info:
        load(checkpoint)
    message = str(info.value)
    assert "'model.layers.0.mlp.up_proj.weight'" in message
    assert "expected shape (128, 64)" in message
    assert "found (128, 32)" in message


def test_index_naming_a_missing_shard_names_the_shard(checkpoint):
    shard = _shard_of(checkpoint, "model.layers.1.self_attn.o_proj.weight")
    shard.unlink()
    with pytest.raises(LoadError, match=re.escape(shard.name)):
        load(checkpoint)
