"""Bad GGUF input through ``loader.load_model``: each a LoadError whose message names the file (and tensor)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import loader
from loader.errors import CheckpointFormatError, UnexpectedWeightError, UnknownArchitectureError, UnsupportedError
from tests.helpers.gguf_files import Q, raw_header, write_gguf
from tests.helpers.hf_checkpoints import build_model, tiny_config


@pytest.fixture(scope="module")
def model():
    return build_model("qwen2", tiny_config("qwen2", vocab_size=288))


def test_wrong_magic(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"\x89HDF" + b"\0" * 100)
    with pytest.raises(CheckpointFormatError, match=r"model\.gguf: not a GGUF file: starts with b'\\x89HDF'"):
        loader.load_model(str(path))


def test_unsupported_version(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(raw_header(version=4) + b"\0" * 100)
    with pytest.raises(UnsupportedError, match=r"model\.gguf: GGUF version 4 is not supported"):
        loader.load_model(str(path))


def test_truncated_file_names_the_tensor_past_the_end(tmp_path, model):
    path = write_gguf(tmp_path / "model.gguf", model, "qwen2", qtype=Q.Q8_0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointFormatError, match=r"model\.gguf: tensor '.+' data runs past the end of the file"):
        loader.load_model(str(path))


def test_unsupported_quant_type_names_tensor_and_type(tmp_path, model):
    path = write_gguf(tmp_path / "model.gguf", model, "qwen2", qtype=Q.Q8_0,
                      tensor_types={"blk.1.ffn_up.weight": Q.IQ4_NL})
    with pytest.raises(UnsupportedError, match=r"tensor 'blk\.1\.ffn_up\.weight' in .*model\.gguf: ggml type "
                                               r"IQ4_NL cannot be dequantized"):
        loader.load_model(str(path))


def test_unknown_tensor_is_refused_by_name(tmp_path, model):
    path = write_gguf(tmp_path / "model.gguf", model, "qwen2",
                      extra_tensors={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64))})
    with pytest.raises(UnexpectedWeightError, match=r"tensor 'blk\.0\.ffn_gate_inp\.weight' in .*model\.gguf"):
        loader.load_model(str(path))


def test_unsupported_architecture(tmp_path):
    import gguf

    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnknownArchitectureError, match=r"model\.gguf: GGUF architecture 'bert' is not supported"):
        loader.load_model(str(path))


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc) here: nothing reads the cache folder")
def test_a_bad_cache_folder_setting_is_named_not_hidden_by_the_header_map(tmp_path, model, monkeypatch):
    """The header's string arrays are walked by a compiled helper found under ``LOADER_CACHE_DIR``: a relative
    folder is the setting's error, not ``BufferError: cannot close exported pointers exist`` from the map."""
    from loader import _length_prefixed
    from loader.errors import SettingError

    path = write_gguf(tmp_path / "model.gguf", model, "qwen2", qtype=Q.Q8_0)
    monkeypatch.setenv("LOADER_CACHE_DIR", "cache")
    _length_prefixed._compiled.cache_clear()
    try:
        with pytest.raises(SettingError, match=r"^LOADER_CACHE_DIR='cache': expected an absolute path"):
            loader.load_model(str(path))
    finally:
        _length_prefixed._compiled.cache_clear()
