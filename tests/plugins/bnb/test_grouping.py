"""A pre-quantized checkpoint's side tensors are bundled into one tensor per weight, or the load fails naming them."""

from __future__ import annotations

import json

import pytest
import torch

from loader.errors import CheckpointFormatError
from loader.weights import EagerTensor
from loader_plugin_bnb.grouping import group_packed_weights
from loader_plugin_bnb.packed_tensor import Packed4bitTensor
from tests.helpers.bnb_checkpoints import packed_weight_tensors

Q = "model.layers.0.self_attn.q_proj.weight"
DOWN = "model.layers.0.mlp.down_proj.weight"
NORM = "model.layers.0.input_layernorm.weight"
FILE = "model-00001-of-00002.safetensors"


def _stream(tensors: dict[str, torch.Tensor], order=None):
    names = order if order is not None else sorted(tensors)
    return [(n, EagerTensor(tensors[n], n, FILE)) for n in names]


def _checkpoint(double_quant=True):
    tensors = {NORM: torch.ones(64)}
    tensors.update(packed_weight_tensors(Q, torch.randn(64, 64), double_quant=double_quant))
    tensors.update(packed_weight_tensors(DOWN, torch.randn(64, 128), double_quant=double_quant, quant_type="fp4"))
    return tensors


@pytest.mark.parametrize("double_quant", [True, False])
def test_each_weight_comes_out_once_with_its_state_and_the_rest_passes_through(double_quant):
    out = list(group_packed_weights(_stream(_checkpoint(double_quant))))
    assert [name for name, _ in out] == [NORM, DOWN, Q]
    down, q = out[1][1], out[2][1]
    assert isinstance(down, Packed4bitTensor) and isinstance(q, Packed4bitTensor)
    assert down.shape == (64, 128) and down.header.quant_type == "fp4"
    assert q.shape == (64, 64) and q.header.nested == double_quant


def test_the_weight_may_come_after_its_side_tensors_and_in_another_file():
    tensors = _checkpoint()
    order = [n for n in sorted(tensors) if n != Q] + [Q]
    names = [name for name, _ in group_packed_weights(_stream(tensors, order))]
    assert names == [NORM, DOWN, Q]


def test_a_missing_absmax_names_the_weight_and_the_tensor():
    tensors = _checkpoint()
    del tensors[f"{Q}.absmax"]
    with pytest.raises(CheckpointFormatError) as info:
        list(group_packed_weights(_stream(tensors)))
    assert str(info.value) == (
        f"tensor {Q!r} in {FILE}: packed 4-bit weight {Q!r} has no '{Q}.absmax' in the checkpoint"
    )


def test_missing_nested_tensors_are_named_when_the_state_says_double_quantization():
    tensors = _checkpoint()
    del tensors[f"{Q}.nested_absmax"]
    with pytest.raises(CheckpointFormatError, match=f"has no '{Q}.nested_absmax' in the checkpoint"):
        list(group_packed_weights(_stream(tensors)))


def test_a_missing_quant_state_is_named():
    tensors = _checkpoint()
    del tensors[f"{Q}.quant_state.bitsandbytes__nf4"]
    with pytest.raises(CheckpointFormatError, match=rf"has no '{Q}.quant_state.bitsandbytes__\*'"):
        list(group_packed_weights(_stream(tensors)))


def test_a_corrupt_quant_state_json_names_the_tensor():
    tensors = _checkpoint()
    state = f"{DOWN}.quant_state.bitsandbytes__fp4"
    tensors[state] = torch.tensor(list(b'{"quant_type": "fp4", "blocksize": 64,'), dtype=torch.uint8)
    with pytest.raises(CheckpointFormatError, match="quant_state is not valid UTF-8 JSON") as info:
        list(group_packed_weights(_stream(tensors)))
    assert str(info.value).startswith(f"tensor {state!r} in {FILE}: ")


def test_a_wrong_packed_size_names_the_tensor():
    tensors = _checkpoint()
    tensors[DOWN] = tensors[DOWN][:100]
    with pytest.raises(CheckpointFormatError, match=rf"tensor {DOWN!r} in {FILE}: packed data .* must be 4096 uint8"):
        list(group_packed_weights(_stream(tensors)))


def test_side_tensors_without_a_packed_weight_are_refused():
    tensors = _checkpoint()
    tensors[Q] = torch.randn(64, 64)  # a dense weight where a packed one belongs
    with pytest.raises(CheckpointFormatError, match=f"bitsandbytes quant state for {Q!r}, but the checkpoint "
                                                    f"has no packed uint8 tensor {Q!r}"):
        list(group_packed_weights(_stream(tensors)))


def test_a_side_tensor_after_its_weight_was_complete_is_refused():
    tensors = _checkpoint(double_quant=False)
    tensors[f"{Q}.nested_absmax"] = torch.ones(1)
    order = [n for n in sorted(tensors) if n != f"{Q}.nested_absmax"] + [f"{Q}.nested_absmax"]
    with pytest.raises(CheckpointFormatError, match=f"belongs to the bitsandbytes weight {Q!r}, which was already"):
        list(group_packed_weights(_stream(tensors, order)))


def test_the_header_is_the_only_tensor_read_while_grouping():
    reads = []

    class Counting(EagerTensor):
        def read(self, dtype=None):
            reads.append(self.name)
            return super().read(dtype)

    tensors = _checkpoint()
    stream = [(n, Counting(t, n, FILE)) for n, t in sorted(tensors.items())]
    list(group_packed_weights(stream))
    assert reads and all(".quant_state." in name for name in reads)
    assert json.loads(bytes(tensors[reads[0]].tolist()))["blocksize"] == 64
