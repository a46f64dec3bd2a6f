"""The weight iterator: HF names, q/k rows back in HF order, rotary tables skipped, refusals by name."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from loader.errors import UnexpectedWeightError, UnsupportedError
from loader.weights import ReadStats
from loader_plugin_gguf.format.weight_stream import iter_gguf_weights
from tests.helpers.gguf_files import Q


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_f32_file_yields_the_hf_state_dict_exactly(tiny_gguf, family):
    path, model = tiny_gguf(family)
    stats = ReadStats()
    got = {name: tensor.read() for name, tensor in iter_gguf_weights([str(path)], stats)}
    expected = {k: v for k, v in model.state_dict().items()
                if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert torch.equal(got[name], value), name  # q/k un-permuted for llama, untouched for qwen
    assert stats.tensors_read == len(expected)
    assert stats.bytes_read == sum(v.numel() * 4 for v in expected.values())


def test_nothing_is_read_while_iterating(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q4_0, rope_scaling=None)
    stats = ReadStats()
    names = [name for name, _ in iter_gguf_weights([str(path)], stats)]
    assert "model.layers.1.self_attn.q_proj.weight" in names
    assert stats.bytes_read == 0


def write(path, tensors):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    for name, (data, qtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def test_rope_freqs_is_skipped(tmp_path):
    path = write(tmp_path / "r.gguf", {"rope_freqs.weight": (np.ones(4, np.float32), None),
                                       "output_norm.weight": (np.ones(4, np.float32), None)})
    assert [name for name, _ in iter_gguf_weights([path], ReadStats())] == ["model.norm.weight"]


def test_unknown_tensor_is_refused_by_name(tmp_path):
    path = write(tmp_path / "u.gguf", {"blk.0.ffn_gate_shexp.weight": (np.ones((2, 4), np.float32), None)})
    with pytest.raises(UnexpectedWeightError,
                       match=r"tensor 'blk\.0\.ffn_gate_shexp\.weight' in .*u\.gguf: no 'llama' model parameter"):
        list(iter_gguf_weights([path], ReadStats()))


def test_unsupported_quant_type_is_refused_before_reading(tmp_path):
    blocks = np.zeros((2, 18), dtype=np.uint8)  # IQ4_NL: 32 values in 18 bytes
    path = write(tmp_path / "q.gguf", {"output_norm.weight": (np.ones(4, np.float32), None),
                                       "blk.0.attn_v.weight": (blocks, Q.IQ4_NL)})
    stats = ReadStats()
    with pytest.raises(UnsupportedError, match=r"tensor 'blk\.0\.attn_v\.weight' in .*q\.gguf: ggml type IQ4_NL "
                                               r"cannot be dequantized; supported: F32, F16, BF16, Q4_0, Q4_1"):
        list(iter_gguf_weights([path], stats))
    assert stats.bytes_read == 0
