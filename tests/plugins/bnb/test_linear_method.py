"""The bitsandbytes linear method on the core's parallel layers, one rank at a time (simulated TP)."""

from __future__ import annotations

import bitsandbytes.functional as F
import pytest
import torch

from loader._distributed import simulated_tp
from loader._plugins import create_plugin_host, use_plugin_host
from loader.errors import CheckpointFormatError, MissingWeightsError, UnsupportedError
from loader.layers.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from loader.layers.param_layout import weight_loader_of
from loader.weights import EagerTensor
from loader_plugin_bnb.config import BitsAndBytesConfig
from loader_plugin_bnb.grouping import group_packed_weights
from tests.helpers.bnb_checkpoints import packed_weight_tensors
from tests.helpers.hf_checkpoints import relative_error

HIDDEN, HEAD, HEADS, KV_HEADS = 128, 32, 4, 2


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def host():
    return create_plugin_host()


@pytest.fixture(scope="module")
def qkv_parts():
    return {"q": torch.randn(HEADS * HEAD, HIDDEN, generator=_gen(1)),
            "k": torch.randn(KV_HEADS * HEAD, HIDDEN, generator=_gen(2)),
            "v": torch.randn(KV_HEADS * HEAD, HIDDEN, generator=_gen(3))}


def _qkv(host, config, rank=0, tp=1, hidden=HIDDEN, head=HEAD, bias=False):
    with use_plugin_host(host), simulated_tp(rank, tp):
        return QKVParallelLinear(hidden, head, HEADS, KV_HEADS, bias=bias, quant_config=config,
                                 prefix="model.layers.0.self_attn.qkv_proj")


def _rank_rows(parts, rank, tp):
    rows = []
    for sid in ("q", "k", "v"):
        per = parts[sid].shape[0] // tp
        rows.append(parts[sid][rank * per:(rank + 1) * per])
    return torch.cat(rows)


def _reference(weight, config):
    packed, state = F.quantize_4bit(weight, blocksize=config.blocksize, quant_type=config.quant_type,
                                    compress_statistics=config.double_quant)
    return packed, state


def _module_rows(parts, rank, tp, config):
    """This rank's rows of each part as bitsandbytes gives them quantizing (and nesting) each module whole."""
    rows = []
    for sid in ("q", "k", "v"):
        whole = F.dequantize_4bit(*_reference(parts[sid], config))
        per = whole.shape[0] // tp
        rows.append(whole[rank * per:(rank + 1) * per])
    return torch.cat(rows)


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("double_quant", [False, True])
@pytest.mark.parametrize("tp", [1, 2])
def test_in_flight_qkv_holds_this_ranks_rows_of_each_module_quantized_whole(host, qkv_parts, quant_type,
                                                                             double_quant, tp):
    config = BitsAndBytesConfig(quant_type=quant_type, double_quant=double_quant)
    for rank in range(tp):
        layer = _qkv(host, config, rank, tp)
        for sid in ("v", "q", "k"):  # any order
            weight_loader_of(layer.weight)(layer.weight, EagerTensor(qkv_parts[sid], f"{sid}_proj.weight"), sid)
        layer.quant_method.process_weights_after_loading(layer)
        # the 4-bit codes are those of this rank's fused slice (blocks never cross parts here) ...
        packed, _ = _reference(_rank_rows(qkv_parts, rank, tp), config)
        assert torch.equal(layer.weight.view(-1), packed.view(-1))
        # ... and the block scales, nested or not, those of each whole module
        expected = _module_rows(qkv_parts, rank, tp, config)
        ours = F.dequantize_4bit(layer.weight, layer.quant_method.bnb_quant_state(layer))
        assert torch.equal(ours, expected)
        assert torch.equal(layer.quant_method.dequantized_weight(layer), ours)
        assert (layer.weight_absmax.dtype == torch.uint8) == double_quant


def test_parts_that_do_not_end_on_block_boundaries_are_quantized_together(host):
    # 4096-value blocks: q's 64 x 48 rows are 3/4 of a block, so parts wait and are quantized as one.
    parts = {"q": torch.randn(64, 48, generator=_gen(1)), "k": torch.randn(32, 48, generator=_gen(2)),
             "v": torch.randn(32, 48, generator=_gen(3))}
    config = BitsAndBytesConfig(blocksize=4096, double_quant=True)
    layer = _qkv(host, config, hidden=48, head=16)
    for sid in ("q", "k", "v"):
        weight_loader_of(layer.weight)(layer.weight, EagerTensor(parts[sid]), sid)
        assert bool(layer.bnb_codes.pending) == (sid != "v")
    layer.quant_method.process_weights_after_loading(layer)
    packed, state = _reference(_rank_rows(parts, 0, 1), config)
    assert torch.equal(layer.weight.view(-1), packed.view(-1))
    assert torch.equal(layer.weight_absmax, state.absmax)


def test_gate_up_and_row_parallel_slices(host):
    config = BitsAndBytesConfig(quant_type="fp4")
    gate, up = torch.randn(256, HIDDEN, generator=_gen(4)), torch.randn(256, HIDDEN, generator=_gen(5))
    down = torch.randn(HIDDEN, 256, generator=_gen(6))
    with use_plugin_host(host), simulated_tp(1, 2):
        gate_up = MergedColumnParallelLinear(HIDDEN, [256, 256], quant_config=config, prefix="mlp.gate_up_proj")
        down_proj = RowParallelLinear(256, HIDDEN, quant_config=config, prefix="mlp.down_proj")
    weight_loader_of(gate_up.weight)(gate_up.weight, EagerTensor(up), 1)
    weight_loader_of(gate_up.weight)(gate_up.weight, EagerTensor(gate), 0)
    weight_loader_of(down_proj.weight)(down_proj.weight, EagerTensor(down))
    for layer, expected in ((gate_up, torch.cat([gate[128:], up[128:]])), (down_proj, down[:, 128:])):
        layer.quant_method.process_weights_after_loading(layer)
        packed, state = _reference(expected.contiguous(), config)
        assert torch.equal(layer.quant_method.dequantized_weight(layer), F.dequantize_4bit(packed, state))


def test_a_checkpoint_that_already_fuses_qkv_is_split_into_its_parts(host, qkv_parts):
    config = BitsAndBytesConfig()
    layer = _qkv(host, config, 0, 2)
    fused = torch.cat([qkv_parts["q"], qkv_parts["k"], qkv_parts["v"]])
    weight_loader_of(layer.weight)(layer.weight, EagerTensor(fused))
    layer.quant_method.process_weights_after_loading(layer)
    packed, _ = _reference(_rank_rows(qkv_parts, 0, 2), config)
    assert torch.equal(layer.weight.view(-1), packed.view(-1))


def test_only_this_ranks_rows_are_read(host, qkv_parts):
    read_shapes = []

    class Recording(EagerTensor):
        def narrow(self, dim, start, length):
            return Recording(self.tensor.narrow(dim, start, length))

        def read(self, dtype=None):
            read_shapes.append(self.shape)
            return super().read(dtype)

    layer = _qkv(host, BitsAndBytesConfig(), 1, 2)
    weight_loader_of(layer.weight)(layer.weight, Recording(qkv_parts["q"]), "q")
    assert read_shapes == [(HEADS * HEAD // 2, HIDDEN)]


def test_forward_is_x_times_the_dequantized_weight_plus_bias_in_the_compute_dtype(host, qkv_parts):
    config = BitsAndBytesConfig(compute_dtype="bfloat16")
    layer = _qkv(host, config, bias=True)
    for sid in ("q", "k", "v"):
        weight_loader_of(layer.weight)(layer.weight, EagerTensor(qkv_parts[sid]), sid)
    layer.bias.data.normal_()
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(2, 3, HIDDEN, generator=_gen(9))
    out = layer(x)
    w = layer.quant_method.dequantized_weight(layer)
    expected = torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), layer.bias.bfloat16()).float()
    assert out.dtype == torch.float32
    assert torch.equal(out, expected)


def test_a_part_never_loaded_is_reported_after_loading(host, qkv_parts):
    layer = _qkv(host, BitsAndBytesConfig())
    weight_loader_of(layer.weight)(layer.weight, EagerTensor(qkv_parts["q"]), "q")
    weight_loader_of(layer.weight)(layer.weight, EagerTensor(qkv_parts["v"]), "v")
    with pytest.raises(MissingWeightsError, match=r"qkv_proj: the checkpoint has no weights for part\(s\) \['k'\]"):
        layer.quant_method.process_weights_after_loading(layer)


# -- pre-quantized ---------------------------------------------------------------------------------


def _packed_parts(parts, double_quant=True, quant_type="nf4"):
    tensors = {}
    for sid, weight in parts.items():
        tensors.update(packed_weight_tensors(f"{sid}_proj.weight", weight, quant_type=quant_type,
                                             double_quant=double_quant))
    grouped = dict(group_packed_weights((n, EagerTensor(t, n, "m.safetensors")) for n, t in sorted(tensors.items())))
    return {sid: grouped[f"{sid}_proj.weight"] for sid in parts}


def _dequantized_parts(parts, double_quant=True, quant_type="nf4"):
    return {sid: F.dequantize_4bit(*F.quantize_4bit(w, blocksize=64, quant_type=quant_type,
                                                    compress_statistics=double_quant))
            for sid, w in parts.items()}


@pytest.mark.parametrize("double_quant", [True, False])
@pytest.mark.parametrize("tp", [1, 2])
def test_prequantized_parts_are_copied_into_place_without_requantizing(host, qkv_parts, double_quant, tp):
    config = BitsAndBytesConfig(quant_type="fp4", double_quant=double_quant, prequantized=True)
    packed = _packed_parts(qkv_parts, double_quant, "fp4")
    expected = _rank_rows(_dequantized_parts(qkv_parts, double_quant, "fp4"), 0, 1)
    rows = []
    for rank in range(tp):
        layer = _qkv(host, config, rank, tp)
        for sid in ("q", "k", "v"):
            weight_loader_of(layer.weight)(layer.weight, packed[sid], sid)
        layer.quant_method.process_weights_after_loading(layer)
        assert layer.weight_absmax.dtype == torch.float32  # nested absmax is expanded exactly
        rows.append(layer.quant_method.dequantized_weight(layer))
    per_rank = [torch.split(r, [HEADS * HEAD // tp, KV_HEADS * HEAD // tp, KV_HEADS * HEAD // tp]) for r in rows]
    stitched = torch.cat([torch.cat([pr[i] for pr in per_rank]) for i in range(3)])
    assert torch.equal(stitched, expected)


def test_prequantized_row_parallel_slices_whole_blocks_of_columns(host):
    down = torch.randn(HIDDEN, 256, generator=_gen(6))
    packed = _packed_parts({"down": down})["down"]
    expected = _dequantized_parts({"down": down})["down"]
    for rank in range(2):
        with use_plugin_host(host), simulated_tp(rank, 2):
            layer = RowParallelLinear(256, HIDDEN, quant_config=BitsAndBytesConfig(prequantized=True),
                                      prefix="mlp.down_proj")
        weight_loader_of(layer.weight)(layer.weight, packed)
        layer.quant_method.process_weights_after_loading(layer)
        assert torch.equal(layer.quant_method.dequantized_weight(layer), expected[:, rank * 128:(rank + 1) * 128])


def test_prequantized_tp_that_splits_blocks_fails_with_shape_blocksize_and_tp(host):
    down = torch.randn(64, 64, generator=_gen(7))
    packed = _packed_parts({"down": down})["down"]
    with use_plugin_host(host), simulated_tp(1, 2):
        layer = RowParallelLinear(64, 64, quant_config=BitsAndBytesConfig(prequantized=True),
                                  prefix="model.layers.0.mlp.down_proj")
    with pytest.raises(UnsupportedError) as info:
        weight_loader_of(layer.weight)(layer.weight, packed)
    message = str(info.value)
    assert message.startswith("tensor 'down_proj.weight' in m.safetensors: cannot split the pre-quantized weight "
                              "of shape (64, 64) (blocksize 64) over tensor parallel size 2 for "
                              "model.layers.0.mlp.down_proj")
    assert "columns [32, 64)" in message


def test_prequantized_parts_that_would_straddle_a_block_cannot_be_fused(host):
    # 16 rows of 42 = 10.5 blocks of 64: k ends mid-block, so v could not start on a block boundary.
    parts = {"q": torch.randn(32, 42, generator=_gen(1)), "k": torch.randn(16, 42, generator=_gen(2))}
    packed = _packed_parts(parts, double_quant=False)
    with use_plugin_host(host):
        layer = QKVParallelLinear(42, 8, 4, 2, quant_config=BitsAndBytesConfig(prequantized=True), prefix="attn.qkv")
    weight_loader_of(layer.weight)(layer.weight, packed["q"], "q")
    with pytest.raises(UnsupportedError, match=r"its 16 x 42 slice at rows \[32, 48\) of the fused 64 x 42 "
                                               r"weight of attn.qkv does not start and end on blocksize-64"):
        weight_loader_of(layer.weight)(layer.weight, packed["k"], "k")


def test_a_dense_tensor_in_a_prequantized_checkpoint_is_refused(host, qkv_parts):
    layer = _qkv(host, BitsAndBytesConfig(prequantized=True))
    with pytest.raises(CheckpointFormatError, match=r"tensor 'q' in <memory>: model.layers.0.self_attn.qkv_proj "
                                                    r"expects a bitsandbytes 4-bit weight .* found float32"):
        weight_loader_of(layer.weight)(layer.weight, EagerTensor(qkv_parts["q"], "q"), "q")


def test_parts_quantized_differently_cannot_share_a_layer(host, qkv_parts):
    nf4 = _packed_parts({"q": qkv_parts["q"]})
    fp4 = _packed_parts({"k": qkv_parts["k"]}, quant_type="fp4")
    layer = _qkv(host, BitsAndBytesConfig(prequantized=True))
    weight_loader_of(layer.weight)(layer.weight, nf4["q"], "q")
    with pytest.raises(CheckpointFormatError, match="quantized with fp4, blocksize 64.*other parts of "
                                                    "model.layers.0.self_attn.qkv_proj used nf4"):
        weight_loader_of(layer.weight)(layer.weight, fp4["k"], "k")


@pytest.mark.parametrize("double_quant", [False, True])
def test_the_layers_quant_state_drives_bitsandbytes_own_matmul(host, qkv_parts, double_quant):
    # the CUDA forward hands this state to bitsandbytes.matmul_4bit; its CPU kernel checks the same contract
    from bitsandbytes import matmul_4bit

    layer = _qkv(host, BitsAndBytesConfig(double_quant=double_quant))
    for sid in ("q", "k", "v"):
        weight_loader_of(layer.weight)(layer.weight, EagerTensor(qkv_parts[sid]), sid)
    layer.quant_method.process_weights_after_loading(layer)
    x = torch.randn(2, 3, HIDDEN, generator=_gen(9))
    native = matmul_4bit(x, layer.weight.t(), layer.quant_method.bnb_quant_state(layer))
    assert relative_error(native, layer(x)) <= 1e-5
