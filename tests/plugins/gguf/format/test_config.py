"""The HF-shaped config a GGUF file's metadata yields, and the Llama 3 rope scaling recovered from rope_freqs."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from loader.errors import ConfigError, UnknownArchitectureError, UnsupportedError
from loader_plugin_gguf.format.config import hf_config
from loader_plugin_gguf.format.header import read_header
from loader_plugin_gguf.format.rope_freqs import llama3_divisors, llama3_scaling_from_divisors
from tests.helpers.gguf_files import Q


def test_llama_config_from_metadata(tiny_gguf):
    path, model = tiny_gguf("llama")
    config = hf_config(read_header(path))
    hf = model.config
    assert config["architectures"] == ["LlamaForCausalLM"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings"):
        assert config[key] == getattr(hf, key), key
    assert config["head_dim"] == hf.hidden_size // hf.num_attention_heads
    assert config["rms_norm_eps"] == float(np.float32(hf.rms_norm_eps)) != hf.rms_norm_eps
    assert config["rope_theta"] == 10000.0
    assert config["tie_word_embeddings"] is False
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)
    assert config["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_qwen2_vocab_from_token_list_and_tied_embeddings(tiny_gguf):
    path, model = tiny_gguf("qwen2")
    header = read_header(path)
    assert "qwen2.vocab_size" not in header.metadata
    config = hf_config(header)
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert config["vocab_size"] == model.config.vocab_size == len(header.metadata["tokenizer.ggml.tokens"])
    assert config["tie_word_embeddings"] is True
    assert config["rope_scaling"] is None


def test_qwen3_head_dim_from_key_length(tiny_gguf):
    path, model = tiny_gguf("qwen3")
    config = hf_config(read_header(path))
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["head_dim"] == model.config.head_dim == 32 != model.config.hidden_size // 4


def write_meta(path, arch="llama", **values):
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in values.items():
        if isinstance(value, str):
            writer.add_string(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return read_header(path)


BASE = dict(block_count=1, embedding_length=4, feed_forward_length=8, vocab_size=8, **{"attention.head_count": 2})


def test_missing_required_key_names_it(tmp_path):
    header = write_meta(tmp_path / "m.gguf", **{k: v for k, v in BASE.items() if k != "feed_forward_length"})
    with pytest.raises(ConfigError, match=r"m\.gguf: metadata key 'llama\.feed_forward_length' is missing"):
        hf_config(header)


def test_unsupported_architecture_names_it(tmp_path):
    header = write_meta(tmp_path / "m.gguf", arch="gpt2", **BASE)
    with pytest.raises(UnknownArchitectureError,
                       match=r"m\.gguf: GGUF architecture 'gpt2' is not supported; supported: llama, qwen2, qwen3"):
        hf_config(header)


def test_vocab_size_disagreeing_with_the_embedding_is_refused(tmp_path):
    header = write_meta(tmp_path / "m.gguf", **{**BASE, "vocab_size": 9})
    with pytest.raises(ConfigError, match="the vocabulary has 9 entries but token_embd.weight has 8 rows"):
        hf_config(header)


def test_linear_rope_scaling_from_metadata(tmp_path):
    header = write_meta(tmp_path / "m.gguf", **BASE, **{"rope.scaling.type": "linear", "rope.scaling.factor": 4.0})
    assert hf_config(header)["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}


def test_unknown_rope_scaling_is_refused(tmp_path):
    header = write_meta(tmp_path / "m.gguf", **BASE, **{"rope.scaling.type": "longrope"})
    with pytest.raises(UnsupportedError, match="'llama.rope.scaling.type' is 'longrope'; supported: none, linear"):
        hf_config(header)


def test_partial_rotary_is_refused(tmp_path):
    header = write_meta(tmp_path / "m.gguf", **BASE, **{"rope.dimension_count": 1})
    with pytest.raises(UnsupportedError, match="partial rotary is not supported"):
        hf_config(header)


@pytest.mark.parametrize(("scaling", "theta", "head_dim"), [
    ({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     500000.0, 128),
    ({"factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
     500000.0, 64),
    ({"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
     10000.0, 16),
])
def test_llama3_scaling_round_trips_through_float32_divisors(scaling, theta, head_dim):
    divisors = llama3_divisors(scaling, theta, head_dim).astype(np.float32)
    got = llama3_scaling_from_divisors(divisors.tolist(), theta, head_dim, "rope_freqs")
    assert got == {"rope_type": "llama3", **scaling}


def test_divisors_with_too_few_in_between_values_still_reproduce_exactly():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    divisors = llama3_divisors(scaling, 10000.0, 8).astype(np.float32)
    got = llama3_scaling_from_divisors(divisors.tolist(), 10000.0, 8, "rope_freqs")
    assert got is not None
    assert np.allclose(llama3_divisors(got, 10000.0, 8), divisors, rtol=1e-6)


def test_all_one_divisors_mean_no_scaling():
    assert llama3_scaling_from_divisors([1.0] * 8, 10000.0, 16, "rope_freqs") is None


def test_divisors_that_are_not_llama3_are_refused_by_name():
    with pytest.raises(UnsupportedError, match=r"tensor 'rope_freqs.weight' in f: rotary divisors are not Llama 3"):
        llama3_scaling_from_divisors([1.0, 3.0, 1.5, 8.0], 10000.0, 8, "tensor 'rope_freqs.weight' in f")
    with pytest.raises(UnsupportedError, match="holds 3 rotary divisors; a head size of 8 needs 4"):
        llama3_scaling_from_divisors([1.0, 1.0, 1.0], 10000.0, 8, "x")


def test_llama_file_without_rope_freqs_has_no_scaling(tiny_gguf):
    path, _ = tiny_gguf("llama", Q.Q8_0, rope_scaling=None)
    assert hf_config(read_header(path))["rope_scaling"] is None
