"""The TP split and weight loading the parallel linears share: layouts, packed splits, ``load_part``."""

from __future__ import annotations

import pytest
import torch

from loader import _distributed as distributed
from loader.errors import PackedSplitError
from loader.layers import MergedColumnParallelLinear, QKVParallelLinear
from loader.layers.default_loader import default_weight_loader
from loader.layers.param_layout import ParamLayout, layout_of, param_shape, set_param_layout, weight_loader_of
from loader.weights import EagerTensor
from tests.helpers.recording_tensor import RecordingTensor


def _build(cls, rank, size, *args, **kwargs):
    with distributed.simulated_tp(rank, size):
        return cls(*args, **kwargs)


def _packed_param(layer, rows: int, pack: int) -> torch.nn.Parameter:
    """A parameter packing ``pack`` output rows per stored row, loaded by ``layer``."""
    param = torch.nn.Parameter(torch.zeros(rows, 8), requires_grad=False)
    set_param_layout(param, ParamLayout(weight_loader=layer.weight_loader, output_dim=0, input_dim=1,
                                        packed_dim=0, pack_factor=pack))
    return param


def test_a_parameter_nobody_described_is_whole_with_the_default_loader():
    plain = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    assert layout_of(plain) == ParamLayout()
    assert weight_loader_of(plain) is default_weight_loader
    assert param_shape(plain) == (3,)
    set_param_layout(plain, ParamLayout(logical_shape=(2, 3)))
    assert param_shape(plain) == (2, 3)


def test_bad_layouts_are_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"^pack_factor must be a positive integer, got 0$"):
        ParamLayout(pack_factor=0)
    param = torch.nn.Parameter(torch.zeros(3), requires_grad=False)
    param._loader_layout = {"output_dim": 0}
    with pytest.raises(TypeError, match=r"^parameter layout must be a ParamLayout, found dict$"):
        layout_of(param)


def test_a_packed_split_off_a_pack_boundary_names_layer_part_and_pack_factor():
    # gate has 12 rows, 6 per rank: rank 1's part starts at row 6, inside the second group of 4
    layer = _build(MergedColumnParallelLinear, 1, 2, 8, [12, 4], prefix="model.layers.0.mlp.gate_up_proj")
    param = _packed_param(layer, 2, 4)
    message = (r"^model.layers.0.mlp.gate_up_proj shard 0: the first row 6 of this rank's part \(in output "
               r"features\) is not a multiple of the pack factor 4, so the part would start or end inside a "
               r"packed element \(tensor parallel size 2\)$")
    with pytest.raises(PackedSplitError, match=message):
        layer.shard_slice(layout_of(param), param.shape, RecordingTensor(torch.zeros(3, 8)), 0)
    loaded = RecordingTensor(torch.zeros(3, 8))
    with pytest.raises(PackedSplitError, match=message):
        weight_loader_of(param)(param, loaded, 0)
    assert loaded.log == [], "nothing is read before the split is refused"


def test_a_packed_split_whose_length_is_off_names_the_row_count():
    layer = _build(MergedColumnParallelLinear, 0, 2, 8, [12, 4], prefix="gate_up")
    param = _packed_param(layer, 2, 4)
    with pytest.raises(PackedSplitError, match=r"^gate_up shard 0: the row count 6 of this rank's part .* "
                                               r"pack factor 4"):
        weight_loader_of(param)(param, RecordingTensor(torch.zeros(3, 8)), 0)


def test_a_prefused_packed_tensor_off_a_pack_boundary_names_the_full_rows():
    layer = _build(MergedColumnParallelLinear, 0, 1, 8, [6, 2], prefix="gate_up")
    param = _packed_param(layer, 2, 4)
    with pytest.raises(PackedSplitError, match=r"^gate_up shard 0: the full row count 6 .* pack factor 4"):
        weight_loader_of(param)(param, RecordingTensor(torch.zeros(2, 8)))


def test_packed_splits_on_boundaries_load_the_right_rows():
    layer = _build(MergedColumnParallelLinear, 1, 2, 8, [16, 8], prefix="gate_up")
    param = _packed_param(layer, 3, 4)  # (8 + 4) / 4 stored rows per rank
    gate, up = torch.arange(32.0).view(4, 8), 100 + torch.arange(16.0).view(2, 8)
    weight_loader_of(param)(param, EagerTensor(gate), 0)
    weight_loader_of(param)(param, EagerTensor(up), 1)
    torch.testing.assert_close(param.data, torch.cat([gate[2:], up[1:]]))


def test_load_part_gets_every_narrowed_part_of_a_prefused_tensor():
    layer = _build(QKVParallelLinear, 1, 2, 6, 2, 4, 2, prefix="attn.qkv_proj")
    calls = []

    def load_part(param, part):
        assert part.whole.shape == (8 if part.shard_id == "q" else 4, 6) and part.cols is None
        calls.append((part.shard_id, part.narrowed.window[0], part.rows, part.offset, part.size))

    param = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    set_param_layout(param, ParamLayout(weight_loader=layer.weight_loader, output_dim=0, input_dim=1,
                                        logical_shape=(8, 6), load_part=load_part))
    # q: 8 rows (4 per rank), k and v: 4 rows each (2 per rank), stacked
    weight_loader_of(param)(param, RecordingTensor(torch.zeros(16, 6)))
    assert calls == [("q", (4, 4), (4, 4), 0, 4), ("k", (10, 2), (2, 2), 4, 2), ("v", (14, 2), (2, 2), 6, 2)]


def test_load_part_of_a_row_parallel_layer_gets_its_input_columns():
    from loader.layers import RowParallelLinear

    layer = _build(RowParallelLinear, 1, 2, 8, 4, prefix="down_proj")
    parts = []
    param = torch.nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
    set_param_layout(param, ParamLayout(weight_loader=layer.weight_loader, output_dim=0, input_dim=1,
                                        logical_shape=(4, 4), load_part=lambda p, part: parts.append(part)))
    weight_loader_of(param)(param, RecordingTensor(torch.zeros(4, 8)))
    (part,) = parts
    assert (part.rows, part.cols, part.narrowed.window, part.offset, part.size) == (
        (0, 4), (4, 4), ((0, 4), (4, 4)), 0, 4)
