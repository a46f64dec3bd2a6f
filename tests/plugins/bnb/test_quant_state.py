"""The JSON quant_state header: what transformers writes parses; anything else names the tensor."""

from __future__ import annotations

import json

import pytest
import torch

from loader.errors import CheckpointFormatError
from loader_plugin_bnb.quant_state import parse_quant_state

NAME = "model.layers.0.mlp.up_proj.weight.quant_state.bitsandbytes__nf4"
WHAT = f"tensor {NAME!r} in model.safetensors"
NESTED = {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [128, 64],
          "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.0515}


def _raw(value) -> torch.Tensor:
    text = value if isinstance(value, str) else json.dumps(value)
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.uint8)


def test_the_header_bitsandbytes_writes_round_trips():
    from bitsandbytes.functional import quantize_4bit

    _, state = quantize_4bit(torch.randn(32, 64).bfloat16(), blocksize=64, quant_type="fp4",
                             compress_statistics=True)
    packed = state.as_dict(packed=True)
    (key,) = [k for k in packed if k.startswith("quant_state.")]
    header = parse_quant_state(packed[key], f"x.weight.{key}", "x")
    assert (header.quant_type, header.blocksize, header.dtype, header.shape) == ("fp4", 64, "bfloat16", (32, 64))
    assert header.nested and header.nested_blocksize == 256
    assert header.nested_offset == pytest.approx(float(state.offset))
    assert (header.packed_bytes, header.blocks) == (1024, 32)


def test_a_header_without_nested_fields_is_single_quantization():
    header = parse_quant_state(_raw({k: NESTED[k] for k in ("quant_type", "blocksize", "dtype", "shape")}),
                               NAME, WHAT)
    assert not header.nested
    assert header.torch_dtype == torch.float32


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (_raw('{"quant_type": "nf4", '), "quant_state is not valid UTF-8 JSON"),
        (torch.tensor([0xFF, 0xFE], dtype=torch.uint8), "quant_state is not valid UTF-8 JSON"),
        (_raw([1, 2]), "quant_state JSON must be an object, found list"),
        (_raw({**NESTED, "quant_type": "fp4"}), "quant_state says quant_type 'fp4' but the tensor name says 'nf4'"),
        (_raw({k: v for k, v in NESTED.items() if k != "blocksize"}), "quant_state JSON has no 'blocksize'"),
        (_raw({**NESTED, "blocksize": 100}), r"blocksize 100 is not one of \(32, 64"),
        (_raw({**NESTED, "blocksize": "64"}), "quant_state field 'blocksize' has the wrong type"),
        (_raw({**NESTED, "dtype": "int8"}), "dtype 'int8' is not one of"),
        (_raw({**NESTED, "shape": [128]}), r"shape \[128\] is not the 2-D \(out_features, in_features\)"),
        (_raw({**NESTED, "nested_dtype": "float16"}), "nested_dtype 'float16' is not 'float32'"),
        (torch.zeros(2, 3, dtype=torch.uint8), "quant_state must be a 1-D uint8 tensor"),
    ],
)
def test_a_corrupt_header_names_the_tensor(raw, message):
    with pytest.raises(CheckpointFormatError, match=message) as info:
        parse_quant_state(raw, NAME, WHAT)
    assert str(info.value).startswith(WHAT)


def test_an_unknown_quant_state_kind_is_refused():
    with pytest.raises(CheckpointFormatError, match="expected a name ending in quant_state.bitsandbytes__nf4"):
        parse_quant_state(_raw(NESTED), "x.weight.quant_state.bitsandbytes__int8", "tensor 'x'")
