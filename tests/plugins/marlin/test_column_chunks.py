"""A wide layer converted for the int4 CPU kernel a slice of output columns at a time: the whole layer's bytes."""

from __future__ import annotations

import pytest
import torch

import loader
from loader_plugin_marlin import column_chunks
from loader_plugin_marlin.awq_format import AWQConfig
from loader_plugin_marlin.column_chunks import int4_by_columns
from loader_plugin_marlin.compressed_tensors_format import PackQuantizedConfig
from loader_plugin_marlin.config import GPTQConfig
from loader_plugin_marlin.kernels import Int4Kernel, choose_kernel
from loader_plugin_marlin.layer_geometry import layer_geometry
from tests.helpers.awq_checkpoints import pack_awq
from tests.helpers.compressed_tensors_checkpoints import pack_compressed_tensors
from tests.helpers.gptq_checkpoints import pack_gptq, quantize, save_gptq_checkpoint
from tests.helpers.hf_checkpoints import reference_logits, relative_error
from tests.helpers.model_checks import random_ids

ROWS, COLS = 128, 208  # three slices of 64 columns and a 16-column tail


def _gptq(group_size, sym, act_order, bits=4):
    def make(weight):
        q = quantize(weight, bits, group_size, sym=sym, act_order=act_order)
        config = GPTQConfig(bits=bits, group_size=group_size, sym=sym, act_order=act_order)
        return config, pack_gptq(q)
    return make


def _awq(weight):
    return AWQConfig(bits=4, group_size=64, sym=False), pack_awq(weight, 64)[0]


def _ct(weight):
    tensors, _ = pack_compressed_tensors(weight, 4, 32, sym=False, actorder=True, scale_dtype=torch.float16)
    return PackQuantizedConfig(bits=4, group_size=32, sym=False, act_order=True), tensors


FORMATS = {
    "gptq-sym-g32": _gptq(32, True, False),
    "gptq-asym-actorder-g64": _gptq(64, False, True),
    "gptq-g16-padded": _gptq(16, True, False),  # groups of 16: rows padded to kernel groups of 32
    "awq-g64": _awq,
    "ct-asym-actorder-g32": _ct,
}


def _layer(make, cols=COLS):
    weight = torch.randn(cols, ROWS, generator=torch.Generator().manual_seed(cols))
    config, tensors = make(weight)
    geometry = layer_geometry("layer", ROWS, [cols], ROWS, tp_rank=0, tp_size=1, bits=config.bits,
                              group_size=config.group_size, act_order=config.act_order,
                              input_pack=config.layout.input_pack, output_pack=config.layout.output_pack)
    return config, geometry, tensors


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_slices_of_columns_pack_to_the_whole_layer_s_kernel(monkeypatch, fmt):
    monkeypatch.setattr(column_chunks, "COLUMN_CHUNK", 64)
    config, geometry, tensors = _layer(FORMATS[fmt])
    whole = choose_kernel(config.layout.to_quantized(tensors, geometry), "auto", torch.bfloat16)
    sliced = int4_by_columns(config.layout, geometry, tensors, bits=4, requested="auto", dtype=torch.bfloat16)
    assert isinstance(whole, Int4Kernel) and isinstance(sliced, Int4Kernel)
    assert torch.equal(sliced.packed.data, whole.packed.data)
    assert torch.equal(sliced.packed.scales_and_zeros, whole.packed.scales_and_zeros)
    assert sliced.packed.group_size == whole.packed.group_size and sliced.padded == whole.padded
    assert (sliced.in_perm is None) == (whole.in_perm is None)
    if whole.in_perm is not None:
        assert torch.equal(sliced.in_perm, whole.in_perm)
    assert sliced.choice == whole.choice
    x = torch.randn(3, ROWS).to(torch.bfloat16)
    assert torch.equal(sliced.matmul(x), whole.matmul(x))


@pytest.mark.parametrize(("make", "cols", "requested", "why"), [
    (_gptq(32, True, False), 64, "auto", "no wider than one slice"),
    (_gptq(32, True, False, bits=8), COLS, "auto", "8-bit"),
    (_gptq(32, True, False), COLS, "dequantize", "the fallback was asked for"),
    (_gptq(32, True, False), 200, "auto", "200 columns: the int4 kernel refuses them, the whole layer says why"),
])
def test_layers_the_slices_do_not_serve_are_left_to_the_whole_conversion(monkeypatch, make, cols, requested, why):
    monkeypatch.setattr(column_chunks, "COLUMN_CHUNK", 64)
    config, geometry, tensors = _layer(make, cols)
    assert int4_by_columns(config.layout, geometry, tensors, bits=config.bits, requested=requested,
                           dtype=torch.bfloat16) is None, why


def test_a_load_through_column_slices_matches_the_reference(monkeypatch, tmp_path):
    """The quantized head and the fused layers of a tiny model converted 64 columns at a time."""
    monkeypatch.setattr(column_chunks, "COLUMN_CHUNK", 64)
    path, reference = save_gptq_checkpoint("llama", tmp_path / "head", bits=4, group_size=32, sym=False,
                                           desc_act=True, lm_head=True, tie_word_embeddings=False)
    model, report = loader.load_model_with_report(str(path), dtype="float32")
    assert {k: v for k, v in report.quantization["layers"]["lm_head"].items() if k != "by_tokens"} == {
        "kernel": "int4pack", "reason": None, "paths_from": "static"}
    assert model.config.vocab_size > 64  # the head really was sliced
    ids = random_ids(reference.config.vocab_size)
    with torch.no_grad():
        assert relative_error(model(ids), reference_logits(reference, ids)) <= 1e-3
