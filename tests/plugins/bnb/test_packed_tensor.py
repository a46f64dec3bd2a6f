"""A pre-quantized weight narrows by whole blocks, reads only its slice, and dequantizes exactly."""

from __future__ import annotations

import bitsandbytes.functional as F
import pytest
import torch

from loader.errors import CheckpointFormatError
from loader.weights import EagerTensor
from loader_plugin_bnb.packed_tensor import BlockAlignmentError, Packed4bitTensor, QuantTensors
from loader_plugin_bnb.quant_state import parse_quant_state
from tests.helpers.bnb_checkpoints import packed_weight_tensors

NAME = "model.layers.0.mlp.down_proj.weight"


def _packed(weight, *, double_quant=True, quant_type="nf4", blocksize=64, edit=None):
    tensors = packed_weight_tensors(NAME, weight, quant_type=quant_type, double_quant=double_quant,
                                    blocksize=blocksize)
    if edit:
        edit(tensors)
    handles = {k: EagerTensor(v, k, "model.safetensors") for k, v in tensors.items()}
    state_name = f"{NAME}.quant_state.bitsandbytes__{quant_type}"
    header = parse_quant_state(tensors[state_name], state_name, "x")
    return Packed4bitTensor(QuantTensors(
        handles[NAME], handles[f"{NAME}.absmax"], handles[f"{NAME}.quant_map"], header,
        handles.get(f"{NAME}.nested_absmax"), handles.get(f"{NAME}.nested_quant_map"),
    ))


def _reference(weight, *, double_quant=True, quant_type="nf4", blocksize=64):
    packed, state = F.quantize_4bit(weight, blocksize=blocksize, quant_type=quant_type,
                                    compress_statistics=double_quant)
    return F.dequantize_4bit(packed, state)


@pytest.fixture
def weight():
    return torch.randn(96, 128, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("double_quant", [True, False])
def test_the_whole_weight_reads_as_the_dequantized_values(weight, double_quant):
    tensor = _packed(weight, double_quant=double_quant)
    assert tensor.shape == (96, 128) and tensor.dtype == torch.float32
    assert torch.equal(tensor.read(), _reference(weight, double_quant=double_quant))
    assert torch.equal(tensor.read(torch.bfloat16), _reference(weight, double_quant=double_quant).bfloat16())


@pytest.mark.parametrize("double_quant", [True, False])
def test_row_and_column_slices_on_block_boundaries_are_exact_slices(weight, double_quant):
    tensor = _packed(weight, double_quant=double_quant)
    expected = _reference(weight, double_quant=double_quant)
    assert torch.equal(tensor.narrow(0, 48, 48).read(), expected[48:])
    assert torch.equal(tensor.narrow(0, 1, 5).read(), expected[1:6])  # 5 rows of 128 = 10 whole blocks
    assert torch.equal(tensor.narrow(1, 64, 64).read(), expected[:, 64:])
    assert torch.equal(tensor.narrow(0, 32, 16).narrow(1, 0, 64).read(), expected[32:48, :64])


def test_reading_a_slice_fetches_only_its_bytes(weight):
    tensor = _packed(weight, double_quant=False).narrow(0, 48, 48)
    packed, absmax = tensor.read_codes()
    assert packed.numel() == 48 * 128 // 2 and absmax.numel() == 48 * 128 // 64
    assert tensor.nbytes == packed.numel() + 4 * absmax.numel()


def test_the_last_rows_may_end_in_a_partial_block():
    weight = torch.randn(5, 48, generator=torch.Generator().manual_seed(0))  # 240 values: 3 blocks + 48
    tensor = _packed(weight, double_quant=False)
    expected = tensor.read()  # (bitsandbytes' CPU dequantize is wrong for blocks longer than a row)
    assert torch.equal(tensor.narrow(0, 4, 1).read(), expected[4:])
    assert torch.equal(tensor.narrow(0, 0, 4).read(), expected[:4])
    with pytest.raises(BlockAlignmentError, match=r"rows \[0, 3\)"):
        tensor.narrow(0, 0, 3)


def test_a_slice_across_blocks_is_refused_with_shape_and_blocksize(weight):
    tensor = _packed(weight)
    with pytest.raises(BlockAlignmentError, match=r"columns \[0, 32\) of the packed weight of shape "
                                                  r"\(96, 128\) do not fall on blocksize-64 boundaries"):
        tensor.narrow(1, 0, 32)
    odd = _packed(torch.randn(96, 96))
    with pytest.raises(BlockAlignmentError, match=r"columns \[0, 64\) .* \(96, 96\) .* blocksize-64"):
        odd.narrow(1, 0, 64)  # rows of 96 are not whole blocks, so no column slice is


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.__setitem__(NAME, t[NAME][:-2]),
         r"packed data of a nf4 weight of shape \(96, 128\) with blocksize 64 must be 6144 uint8 values, "
         r"found uint8 of shape \(6142, 1\)"),
        (lambda t: t.__setitem__(f"{NAME}.absmax", t[f"{NAME}.absmax"].float()),
         "absmax of a nf4 weight .* must be 192 uint8 values, found float32"),
        (lambda t: t.__setitem__(f"{NAME}.nested_absmax", torch.ones(2)),
         "nested_absmax of a nf4 weight .* must be 1 float32 values"),
    ],
)
def test_tensors_of_the_wrong_size_name_the_tensor(weight, edit, message):
    with pytest.raises(CheckpointFormatError, match=message) as info:
        _packed(weight, edit=edit)
    assert str(info.value).startswith("tensor 'model.layers.0.mlp.down_proj.weight")


def test_a_quant_map_that_is_not_the_code_table_is_refused(weight):
    tensor = _packed(weight, edit=lambda t: t[f"{NAME}.quant_map"].mul_(2))
    with pytest.raises(CheckpointFormatError, match=r"down_proj.weight.quant_map'.*is not the nf4 code table"):
        tensor.read()
