"""4-bit layers packed from their int32 words by the compiled helper: the bytes of the general conversion.

The general conversion (unpack every code to a byte, then build torch's layout: the pure-torch path) is what
runs without a compiler; the compiled path must write the same kernel, tensor for tensor, for every format and
every group shape it takes, and leave to the general path the layers it does not take.
"""

from __future__ import annotations

import pytest
import torch

import loader
from loader.kernels import native_repack
from loader_plugin_marlin.awq_format import AWQConfig
from loader_plugin_marlin.compressed_tensors_format import PackQuantizedConfig
from loader_plugin_marlin.config import GPTQConfig
from loader_plugin_marlin.layer_geometry import layer_geometry
from loader_plugin_marlin.layer_kernels import build_kernel, kernel_tensors
from loader_plugin_marlin.word_packing import int4_from_words, layer_kernel
from tests.helpers.awq_checkpoints import awq_tensors
from tests.helpers.compressed_tensors_checkpoints import ct_tensors, save_ct_checkpoint
from tests.helpers.gptq_checkpoints import pack_gptq, quantize, save_gptq_checkpoint

pytestmark = pytest.mark.skipif(native_repack() is None, reason="no compiled packing helpers here")


def _gptq(group_size, sym, checkpoint_format="gptq"):
    def make(weight):
        q = quantize(weight, 4, group_size, sym=sym)
        config = GPTQConfig(bits=4, group_size=group_size, sym=sym, checkpoint_format=checkpoint_format)
        return config, pack_gptq(q, checkpoint_format=checkpoint_format)
    return make


def _awq(group_size):
    def make(weight):
        return AWQConfig(bits=4, group_size=group_size, sym=False), awq_tensors(quantize(weight, 4, group_size,
                                                                                        sym=False))
    return make


def _ct(group_size, sym):
    def make(weight):
        q = quantize(weight, 4, group_size, sym=sym)
        config = PackQuantizedConfig(bits=4, group_size=group_size, sym=sym)
        return config, ct_tensors(q, sym=sym, scale_dtype=torch.float16)
    return make


FORMATS = {
    "gptq-v1-sym-g32": _gptq(32, True),
    "gptq-v1-asym-g128": _gptq(128, False),
    "gptq-v2-asym-g64": _gptq(64, False, "gptq_v2"),
    "gptq-channelwise": _gptq(-1, True),
    "awq-g64": _awq(64),
    "awq-channelwise": _awq(-1),
    "ct-sym-g32": _ct(32, True),
    "ct-asym-g128": _ct(128, False),
}


def _layer(make, rows, cols):
    weight = torch.randn(cols, rows, generator=torch.Generator().manual_seed(rows + cols))
    config, tensors = make(weight)
    geometry = layer_geometry("layer", rows, [cols], rows, tp_rank=0, tp_size=1, bits=4,
                              group_size=config.group_size, act_order=config.act_order,
                              input_pack=config.layout.input_pack, output_pack=config.layout.output_pack)
    return config, geometry, tensors


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cols", [80, 208])  # a tail of 16 rows after whole blocks (of 64, or 32 on AVX2)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_words_pack_to_the_kernel_the_general_conversion_builds(fmt, cols, dtype):
    config, geometry, tensors = _layer(FORMATS[fmt], 256, cols)
    assert int4_from_words(config, geometry, tensors, dtype) is not None  # the compiled path takes the layer
    compiled = layer_kernel(config, geometry, tensors, dtype)
    general = build_kernel(config, geometry, tensors, dtype)
    assert type(compiled) is type(general) and compiled.choice == general.choice  # the kernel and its paths
    got, expected = kernel_tensors(compiled), kernel_tensors(general)
    assert [name for name, _ in got] == [name for name, _ in expected]
    for (name, tensor), (_, reference) in zip(got, expected, strict=True):
        assert tensor.dtype == reference.dtype and torch.equal(tensor, reference), name
    assert (compiled.packed.group_size, compiled.in_perm, compiled.padded) == \
        (general.packed.group_size, general.in_perm, general.padded)


@pytest.mark.parametrize(("config", "why"), [
    (GPTQConfig(bits=4, group_size=32, sym=True, act_order=True), "act-order: rows are gathered"),
    (GPTQConfig(bits=8, group_size=32, sym=True), "8-bit"),
    (GPTQConfig(bits=4, group_size=16, sym=True), "groups of 16: rows padded to the kernel's 32"),
    (GPTQConfig(bits=4, group_size=32, sym=True, kernel="dequantize"), "the fallback was asked for"),
])
def test_layers_the_words_do_not_serve_are_left_to_the_general_conversion(config, why):
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    q = quantize(weight, config.bits, config.group_size, sym=True, act_order=config.act_order)
    geometry = layer_geometry("layer", 128, [64], 128, tp_rank=0, tp_size=1, bits=config.bits,
                              group_size=config.group_size, act_order=config.act_order, input_pack=True,
                              output_pack=True)
    assert int4_from_words(config, geometry, pack_gptq(q), torch.bfloat16) is None, why


def test_a_layer_the_kernel_refuses_is_left_to_the_general_conversion_which_says_why():
    config, geometry, tensors = _layer(_gptq(32, True), 128, 200)  # 200 output features: not a multiple of 16
    assert int4_from_words(config, geometry, tensors, torch.bfloat16) is None
    assert "not a multiple of 16" in str(build_kernel(config, geometry, tensors, torch.bfloat16).choice.reason)


def test_a_bad_g_idx_is_refused_by_name_as_the_general_conversion_refuses_it():
    config, geometry, tensors = _layer(_gptq(32, True), 128, 64)
    tensors["g_idx"] = tensors["g_idx"].flip(0).contiguous()
    with pytest.raises(Exception, match=r"layer\.g_idx: row 0 is in group 3, but with group_size 32 without "
                                        r"act-order it belongs to group 0"):
        int4_from_words(config, geometry, tensors, torch.bfloat16)


def _buffers(model):
    return {name: t.clone() for name, t in model.named_buffers()}


@pytest.mark.parametrize("kind", ["gptq", "ct"])
def test_a_load_packs_the_same_bytes_compiled_and_with_torch_alone(tmp_path, monkeypatch, kind):
    """Whole models, tensor parallel splits of fused layers included: the compiled load and the torch-only
    load (``LOADER_NATIVE_REPACK=0``) hold bit-equal buffers."""
    if kind == "gptq":
        path, _ = save_gptq_checkpoint("llama", tmp_path / kind, bits=4, group_size=32, sym=False)
    else:
        path, _ = save_ct_checkpoint("qwen2", tmp_path / kind, bits=4, group_size=32, sym=False)
    monkeypatch.setenv("LOADER_MARLIN_PACKED_CACHE", "0")
    compiled = _buffers(loader.load_model(str(path), dtype="bfloat16"))
    monkeypatch.setenv("LOADER_NATIVE_REPACK", "0")
    native_repack.cache_clear()
    try:
        alone = _buffers(loader.load_model(str(path), dtype="bfloat16"))
    finally:
        native_repack.cache_clear()
    assert compiled.keys() == alone.keys() and any("packed_packed_data" in name for name in compiled)
    for name, tensor in compiled.items():
        assert torch.equal(tensor, alone[name]), name
