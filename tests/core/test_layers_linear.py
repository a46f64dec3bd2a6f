"""Parallel linear layers: placement of fused parts, TP shards, narrow-before-read, quant methods."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from loader import _distributed as distributed
from loader.errors import ShapeMismatchError, UnsupportedError
from loader.layers import (
    ColumnParallelLinear,
    LinearMethodBase,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    QuantizationConfig,
    RowParallelLinear,
    UnquantizedLinearMethod,
)
from loader.layers.linear import OutputPart
from loader.layers.param_layout import ParamLayout, layout_of, set_param_layout, weight_loader_of
from loader.weights import EagerTensor
from tests.helpers.recording_tensor import RecordingTensor


def _load(param, tensor, shard_id=None, name="w"):
    weight_loader_of(param)(param, EagerTensor(tensor, name, "model.safetensors"), shard_id)


def _build(cls, rank, size, *args, **kwargs):
    with distributed.simulated_tp(rank, size):
        return cls(*args, **kwargs)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


def test_column_tp1_matches_f_linear(gen):
    w, b = torch.randn(12, 8, generator=gen), torch.randn(12, generator=gen)
    layer = ColumnParallelLinear(8, 12, bias=True)
    assert layer.weight.shape == (12, 8) and layer.weight.dtype == torch.get_default_dtype()
    _load(layer.weight, w)
    _load(layer.bias, b)
    x = torch.randn(3, 5, 8, generator=gen)
    torch.testing.assert_close(layer(x), F.linear(x, w, b), rtol=0, atol=0)
    assert isinstance(layer.quant_method, UnquantizedLinearMethod)


def test_params_dtype_is_honoured():
    layer = RowParallelLinear(8, 4, bias=True, params_dtype=torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and layer.bias.dtype == torch.bfloat16
    assert layout_of(layer.bias) == ParamLayout(weight_loader=layer.weight_loader, output_dim=0)
    assert layout_of(layer.weight).input_dim == 1 and weight_loader_of(layer.weight) == layer.weight_loader


def test_no_bias_registers_none():
    layer = ColumnParallelLinear(8, 4)
    assert layer.bias is None
    assert [n for n, _ in layer.named_parameters()] == ["weight"]


@pytest.mark.parametrize("size", [2, 4])
def test_column_shards_concatenate_to_full_output(gen, size):
    w, b = torch.randn(16, 8, generator=gen), torch.randn(16, generator=gen)
    x = torch.randn(2, 8, generator=gen)
    outs = []
    for rank in range(size):
        layer = _build(ColumnParallelLinear, rank, size, 8, 16, bias=True)
        assert layer.weight.shape == (16 // size, 8)
        _load(layer.weight, w)
        _load(layer.bias, b)
        outs.append(layer(x))
    torch.testing.assert_close(torch.cat(outs, -1), F.linear(x, w, b))


@pytest.mark.parametrize("size", [2, 4])
def test_row_shards_sum_to_full_output_bias_once(gen, size):
    w, b = torch.randn(6, 16, generator=gen), torch.randn(6, generator=gen)
    x = torch.randn(3, 16, generator=gen)
    partial = torch.zeros(3, 6)
    for rank in range(size):
        layer = _build(RowParallelLinear, rank, size, 16, 6, bias=True, reduce_results=False)
        assert layer.weight.shape == (6, 16 // size)
        _load(layer.weight, w)
        _load(layer.bias, b)
        torch.testing.assert_close(layer.bias.data, b)  # bias is not split
        partial += layer(x.chunk(size, -1)[rank])
    torch.testing.assert_close(partial, F.linear(x, w, b))


def test_merged_gate_up_placement_tp1(gen):
    gate, up = torch.randn(10, 8, generator=gen), torch.randn(6, 8, generator=gen)
    layer = MergedColumnParallelLinear(8, [10, 6])
    _load(layer.weight, up, 1)
    _load(layer.weight, gate, 0)
    torch.testing.assert_close(layer.weight.data, torch.cat([gate, up]))


def test_merged_placement_tp2(gen):
    gate, up = torch.randn(8, 4, generator=gen), torch.randn(8, 4, generator=gen)
    for rank in range(2):
        layer = _build(MergedColumnParallelLinear, rank, 2, 4, [8, 8], bias=True)
        _load(layer.weight, gate, 0)
        _load(layer.weight, up, 1)
        _load(layer.bias, gate[:, 0], 0)
        _load(layer.bias, up[:, 0], 1)
        rows = slice(4 * rank, 4 * rank + 4)
        torch.testing.assert_close(layer.weight.data, torch.cat([gate[rows], up[rows]]))
        torch.testing.assert_close(layer.bias.data, torch.cat([gate[rows, 0], up[rows, 0]]))


def test_qkv_tp1_matches_concatenated_projection(gen):
    hidden, head, heads, kv = 16, 4, 4, 2
    wq = torch.randn(heads * head, hidden, generator=gen)
    wk, wv = (torch.randn(kv * head, hidden, generator=gen) for _ in range(2))
    bq, bk, bv = torch.randn(16, generator=gen), torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    layer = QKVParallelLinear(hidden, head, heads, kv, bias=True)
    assert (layer.num_heads, layer.num_kv_heads, layer.num_kv_head_replicas) == (4, 2, 1)
    assert (layer.q_size, layer.kv_size) == (16, 8)
    for sid, w, b in (("v", wv, bv), ("q", wq, bq), ("k", wk, bk)):
        _load(layer.weight, w, sid)
        _load(layer.bias, b, sid)
    x = torch.randn(2, 3, hidden, generator=gen)
    expected = F.linear(x, torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv]))
    torch.testing.assert_close(layer(x), expected, rtol=0, atol=0)


def test_qkv_defaults_kv_heads_to_heads():
    layer = QKVParallelLinear(8, 2, 4)
    assert layer.num_kv_heads == 4 and layer.weight.shape == (24, 8)


@pytest.mark.parametrize(("size", "kv_heads", "replicas"), [(2, 2, 1), (4, 2, 2), (2, 1, 2), (4, 1, 4)])
def test_qkv_shards_and_replicated_kv_heads(gen, size, kv_heads, replicas):
    head, heads, hidden = 2, 4, 6
    wq = torch.randn(heads * head, hidden, generator=gen)
    wk, wv = (torch.randn(kv_heads * head, hidden, generator=gen) for _ in range(2))
    for rank in range(size):
        layer = _build(QKVParallelLinear, rank, size, hidden, head, heads, kv_heads)
        assert layer.num_kv_head_replicas == replicas
        assert layer.num_heads == heads // size
        for sid, w in (("q", wq), ("k", wk), ("v", wv)):
            _load(layer.weight, w, sid)
        q_rows = wq.view(heads, head, hidden).chunk(size)[rank].reshape(-1, hidden)
        kv_head = rank // replicas
        n_kv = layer.num_kv_heads
        k_rows = wk.view(kv_heads, head, hidden)[kv_head * n_kv:(kv_head + 1) * n_kv].reshape(-1, hidden)
        v_rows = wv.view(kv_heads, head, hidden)[kv_head * n_kv:(kv_head + 1) * n_kv].reshape(-1, hidden)
        torch.testing.assert_close(layer.weight.data, torch.cat([q_rows, k_rows, v_rows]))


def test_qkv_loads_prefused_checkpoint_tensor(gen):
    fused = torch.randn(4 * 2 + 2 * 2 * 2, 6, generator=gen)
    for rank in range(2):
        split = _build(QKVParallelLinear, rank, 2, 6, 2, 4, 2)
        whole = _build(QKVParallelLinear, rank, 2, 6, 2, 4, 2)
        _load(whole.weight, fused)
        for sid, part in zip("qkv", fused.split([8, 4, 4]), strict=True):
            _load(split.weight, part, sid)
        torch.testing.assert_close(whole.weight.data, split.weight.data)


@pytest.mark.parametrize(("size", "rank", "sid", "expected"), [
    # (this rank's checkpoint rows, destination offset, size) for q=4 heads, kv=2 heads, head=2
    (2, 1, "q", (4, 4, 0, 4)),
    (2, 1, "k", (2, 2, 4, 2)),
    (2, 1, "v", (2, 2, 6, 2)),
    (4, 3, "q", (6, 2, 0, 2)),
    (4, 3, "k", (2, 2, 2, 2)),
    (4, 2, "v", (2, 2, 4, 2)),
    (4, 1, "k", (0, 2, 2, 2)),
])
def test_shard_slice_arithmetic_qkv(size, rank, sid, expected):
    layer = _build(QKVParallelLinear, rank, size, 6, 2, 4, 2)
    rows = {"q": 8, "k": 4, "v": 4}[sid]
    loaded = RecordingTensor(torch.zeros(rows, 6))
    narrowed, offset, length = layer.shard_slice(layout_of(layer.weight), layer.weight.shape, loaded, sid)
    assert (narrowed.window[0][0], narrowed.shape[0], offset, length) == expected
    assert narrowed.shape[1] == 6


@pytest.mark.parametrize(("size", "rank", "sid", "expected"), [
    (2, 0, 0, (0, 6, 0, 6)),
    (2, 1, 1, (2, 2, 6, 2)),
    (4, 3, 0, (9, 3, 0, 3)),
    (4, 3, 1, (3, 1, 3, 1)),
])
def test_shard_slice_arithmetic_merged(size, rank, sid, expected):
    layer = _build(MergedColumnParallelLinear, rank, size, 5, [12, 4])
    loaded = RecordingTensor(torch.zeros([12, 4][sid], 5))
    narrowed, offset, length = layer.shard_slice(layout_of(layer.weight), layer.weight.shape, loaded, sid)
    assert (narrowed.window[0][0], narrowed.shape[0], offset, length) == expected


def test_public_part_description():
    qkv = _build(QKVParallelLinear, 3, 4, 6, 2, 4, 2)
    assert qkv.shard_ids() == ["q", "k", "v"]
    assert qkv.output_part("k") == OutputPart(start=2, length=2, offset=2, full=4)
    merged = _build(MergedColumnParallelLinear, 1, 2, 4, [8, 4])
    assert merged.shard_ids() == [0, 1]
    assert merged.output_part(1) == OutputPart(start=2, length=2, offset=4, full=4)
    assert ColumnParallelLinear(4, 6).shard_ids() == [None]
    assert _build(RowParallelLinear, 1, 2, 4, 6).output_part() == OutputPart(0, 6, 0, 6)


def test_shard_slice_packed_output_dim():
    """A packed quantized parameter (4 logical rows per stored row along output_dim)."""
    layer = _build(MergedColumnParallelLinear, 1, 2, 8, [16, 32])
    layout = ParamLayout(output_dim=0, input_dim=1, packed_dim=0, pack_factor=4)
    # (16 + 32) / 2 / 4 = 6 stored rows per rank
    narrowed, offset, length = layer.shard_slice(layout, (6, 8), RecordingTensor(torch.zeros(8, 8)), 1)
    assert (narrowed.window[0], offset, length) == ((4, 4), 2, 4)


def test_shard_slice_packed_input_dim_row_parallel():
    layer = _build(RowParallelLinear, 1, 2, 64, 4)
    # checkpoint layout (in / 8, out) = (8, 4): rank 1 owns packed input rows 4..7
    qweight = torch.nn.Parameter(torch.empty(4, 4), requires_grad=False)
    set_param_layout(qweight, ParamLayout(weight_loader=layer.weight_loader, output_dim=1, input_dim=0,
                                          packed_dim=0, pack_factor=8))
    loaded = RecordingTensor(torch.arange(32.0).view(8, 4))
    narrowed, offset, length = layer.shard_slice(layout_of(qweight), qweight.shape, loaded, None)
    assert narrowed.window == ((4, 4), (0, 4)) and (offset, length) == (0, 4)
    layer.weight_loader(qweight, loaded)
    torch.testing.assert_close(qweight.data, torch.arange(16.0, 32.0).view(4, 4))


def test_param_without_output_dim_is_copied_whole():
    layer = _build(QKVParallelLinear, 1, 2, 4, 2, 2, 2)
    scale = torch.nn.Parameter(torch.empty(()), requires_grad=False)
    layer.weight_loader(scale, EagerTensor(torch.tensor(0.5)), "k")
    assert scale.item() == 0.5
    narrowed, offset, size = layer.shard_slice(layout_of(scale), scale.shape, EagerTensor(torch.tensor(0.5)), "q")
    assert (narrowed.shape, offset, size) == ((), 0, 1)


def test_column_loader_reads_only_its_rows():
    layer = _build(ColumnParallelLinear, 2, 4, 8, 16, bias=True)
    w = RecordingTensor(torch.arange(128.0).view(16, 8), "proj.weight")
    b = RecordingTensor(torch.arange(16.0), "proj.bias")
    layer.weight_loader(layer.weight, w)
    layer.weight_loader(layer.bias, b)
    assert w.log == [((8, 4), (0, 8))]
    assert b.log == [((8, 4),)]
    torch.testing.assert_close(layer.weight.data, torch.arange(64.0, 96.0).view(4, 8))


def test_row_loader_reads_only_its_columns():
    layer = _build(RowParallelLinear, 1, 2, 8, 3)
    w = RecordingTensor(torch.arange(24.0).view(3, 8), "down.weight")
    layer.weight_loader(layer.weight, w)
    assert w.log == [((0, 3), (4, 4))]


def test_qkv_loader_reads_only_its_heads():
    layer = _build(QKVParallelLinear, 3, 4, 6, 2, 4, 2)
    k = RecordingTensor(torch.randn(4, 6), "k_proj.weight")
    layer.weight_loader(layer.weight, k, "k")
    assert k.log == [((2, 2), (0, 6))]


def test_shape_mismatch_names_tensor_expected_and_found():
    layer = ColumnParallelLinear(8, 12, prefix="model.layers.0.mlp.up_proj")
    bad = EagerTensor(torch.zeros(12, 7), "model.layers.0.mlp.up_proj.weight", "model-00001.safetensors")
    with pytest.raises(ShapeMismatchError) as info:
        layer.weight_loader(layer.weight, bad)
    msg = str(info.value)
    assert "'model.layers.0.mlp.up_proj.weight' in model-00001.safetensors" in msg
    assert "expected shape (12, 8)" in msg and "found (12, 7)" in msg


def test_shape_mismatch_on_sharded_dim_reports_full_shape():
    layer = _build(QKVParallelLinear, 0, 2, 6, 2, 4, 2, prefix="attn.qkv_proj")
    with pytest.raises(ShapeMismatchError, match=r"expected shape \(4, 6\) for attn.qkv_proj shard 'k', "
                                                 r"found \(6, 6\)"):
        _load(layer.weight, torch.zeros(6, 6), "k", name="k_proj.weight")


def test_indivisible_heads_are_refused():
    with pytest.raises(UnsupportedError,
                       match="num_attention_heads=6 is not divisible by tensor parallel size 4"):
        _build(QKVParallelLinear, 0, 4, 12, 2, 6, 2)


def test_kv_heads_that_cannot_be_replicated_are_refused():
    with pytest.raises(UnsupportedError,
                       match=r"tensor parallel size 4 is not a multiple of num_key_value_heads=3"):
        _build(QKVParallelLinear, 0, 4, 16, 2, 8, 3)
    with pytest.raises(UnsupportedError,
                       match="num_key_value_heads=6 is not divisible by tensor parallel size 4"):
        _build(QKVParallelLinear, 0, 4, 16, 2, 8, 6)


def test_indivisible_linear_sizes_name_the_layer():
    with pytest.raises(UnsupportedError,
                       match=r"mlp\.down_proj input_size=10 is not divisible by tensor parallel size 4"):
        _build(RowParallelLinear, 0, 4, 10, 4, prefix="mlp.down_proj")
    with pytest.raises(UnsupportedError, match="ColumnParallelLinear output_size=6 is not divisible"):
        _build(ColumnParallelLinear, 0, 4, 10, 6)


def test_bad_shard_ids_are_programming_errors():
    with pytest.raises(ValueError, match="shard_id must be 'q', 'k' or 'v'"):
        _load(QKVParallelLinear(4, 2, 2).weight, torch.zeros(4, 4), "x")
    with pytest.raises(ValueError, match=r"shard_id must be 0..1"):
        _load(MergedColumnParallelLinear(4, [2, 2]).weight, torch.zeros(2, 4), 2)


# -- quantize methods ----------------------------------------------------------------------------


class _HalfConfig(QuantizationConfig):
    """Quantizes every linear it is asked about with a fresh recording method, except ``lm_head``."""

    name = "half-test"

    def __init__(self) -> None:
        self.prefixes: list[str] = []

    def ignores(self, prefix: str) -> bool:
        return prefix.endswith("lm_head")

    def get_quant_method(self, layer, prefix):
        self.prefixes.append(prefix)
        return _RecordingMethod()


class _RecordingMethod(LinearMethodBase):
    """Stores the weight transposed, to prove the layer uses the method for both params and math."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def create_weights(self, layer, shape):
        self.calls.append((shape.input_size_per_partition, list(shape.output_partition_sizes), shape.input_size,
                           shape.output_size))
        w = torch.nn.Parameter(torch.empty(shape.input_size_per_partition, shape.output_size_per_partition),
                               requires_grad=False)
        set_param_layout(w, ParamLayout(weight_loader=shape.weight_loader, output_dim=1, input_dim=0))
        layer.register_parameter("weight_t", w)

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight_t.t(), bias)


def test_quant_method_comes_from_the_config_and_does_the_math(gen):
    config = _HalfConfig()
    layer = _build(MergedColumnParallelLinear, 1, 2, 4, [4, 6], bias=True, quant_config=config,
                   prefix="mlp.gate_up_proj")
    skipped = ColumnParallelLinear(4, 4, quant_config=config, prefix="lm_head")
    assert config.prefixes == ["mlp.gate_up_proj"], "a skipped layer never asks for a method"
    assert isinstance(skipped.quant_method, UnquantizedLinearMethod)
    assert layer.quant_method.calls == [(4, [2, 3], 4, 10)]
    gate, up = torch.randn(4, 4, generator=gen), torch.randn(6, 4, generator=gen)
    # output_dim=1 here: the checkpoint tensor is transposed to match the parameter's layout
    layer.weight_loader(layer.weight_t, EagerTensor(gate.t().contiguous()), 0)
    layer.weight_loader(layer.weight_t, EagerTensor(up.t().contiguous()), 1)
    _load(layer.bias, torch.zeros(4), 0)
    _load(layer.bias, torch.zeros(6), 1)
    x = torch.randn(2, 4, generator=gen)
    torch.testing.assert_close(layer(x), F.linear(x, torch.cat([gate[2:], up[3:]])))
