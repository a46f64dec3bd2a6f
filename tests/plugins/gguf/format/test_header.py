"""The GGUF header reader: a valid file parses; every malformed file is a LoadError naming the file."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path

import gguf
import numpy as np
import pytest

from loader.errors import CheckpointFormatError, LoadError, UnsupportedError
from loader_plugin_gguf.format.header import read_header, sniff
from tests.helpers.gguf_files import Q, encode, gguf_string, raw_header


def small_file(path: Path, *, raw_type: Q | None = None, extra_tensor: np.ndarray | None = None) -> Path:
    """A valid two-tensor file: an F32 vector and a Q8_0 matrix (plus one raw tensor if asked)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_token_list(["a", "b", "c"])
    writer.add_array("test.numbers", [1, 2, 3])
    writer.add_tensor("output_norm.weight", np.arange(8, dtype=np.float32))
    matrix = np.linspace(-1, 1, 4 * 64, dtype=np.float32).reshape(4, 64)
    writer.add_tensor("token_embd.weight", encode(matrix, Q.Q8_0), raw_dtype=Q.Q8_0)
    if extra_tensor is not None:
        writer.add_tensor("output.weight", extra_tensor, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_reads_metadata_tensor_table_and_data_offsets(tmp_path):
    header = read_header(small_file(tmp_path / "ok.gguf"))
    assert header.version == 3
    assert header.architecture == "llama"
    assert header.metadata["llama.block_count"] == 1
    assert header.metadata["llama.attention.layer_norm_rms_epsilon"] == float(np.float32(1e-5))
    assert header.metadata["tokenizer.ggml.tokens"] == ["a", "b", "c"]
    assert header.metadata["test.numbers"].tolist() == [1, 2, 3]
    norm, embed = header.tensors
    assert (norm.name, norm.shape, norm.ggml_type, norm.nbytes) == ("output_norm.weight", (8,), Q.F32, 32)
    assert (embed.name, embed.shape, embed.ggml_type) == ("token_embd.weight", (4, 64), Q.Q8_0)
    assert embed.nbytes == 4 * 2 * 34  # two 34-byte Q8_0 blocks per row
    reader = gguf.GGUFReader(header.path)
    assert [t.data_offset for t in reader.tensors] == [norm.offset, embed.offset]


def write_bytes(tmp_path: Path, data: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def test_wrong_magic_names_the_file(tmp_path):
    path = write_bytes(tmp_path, raw_header(magic=b"GGML") + b"\0" * 64)
    with pytest.raises(CheckpointFormatError, match=r"bad\.gguf: not a GGUF file: starts with b'GGML'"):
        read_header(path)


def test_unsupported_version_names_the_file_and_version(tmp_path):
    path = write_bytes(tmp_path, raw_header(version=7) + b"\0" * 64)
    with pytest.raises(UnsupportedError, match=r"bad\.gguf: GGUF version 7 is not supported; expected one of \[2, 3\]"):
        read_header(path)


def test_big_endian_file_is_refused_as_such(tmp_path):
    path = write_bytes(tmp_path, b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    with pytest.raises(UnsupportedError, match="big-endian GGUF files are not supported"):
        read_header(path)


def test_file_shorter_than_a_header_is_truncated(tmp_path):
    path = write_bytes(tmp_path, b"GGU")
    with pytest.raises(CheckpointFormatError, match=r"bad\.gguf: truncated file: 3 bytes"):
        read_header(path)


def test_file_cut_inside_the_metadata_is_truncated(tmp_path):
    full = small_file(tmp_path / "full.gguf").read_bytes()
    cut = full.index(b"tokenizer.ggml.tokens") + 40  # inside the token list
    path = write_bytes(tmp_path, full[:cut])
    with pytest.raises(CheckpointFormatError,
                       match=r"bad\.gguf: truncated or corrupt file: metadata key 'tokenizer\.ggml\.tokens'"):
        read_header(path)


def test_a_string_array_item_cut_by_the_end_of_the_file_names_key_and_item(tmp_path):
    kv = (gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 3)
          + gguf_string("a") + gguf_string("bb") + gguf_string(b"c", length=40))
    path = write_bytes(tmp_path, raw_header(kv_count=1, kv=kv) + b"\0" * 24)
    with pytest.raises(CheckpointFormatError,
                       match=r"bad\.gguf: truncated file: item 2 of the 3 strings of metadata key "
                             r"'tokenizer\.ggml\.tokens' runs past the end of the file"):
        read_header(path)


def test_vocabulary_strings_are_decoded_when_read_and_a_bad_one_is_named_then(tmp_path):
    """A load needs only the tensor table behind the vocabulary, so the header keeps the strings as bytes
    (decoding ~100k of them was a third of a SmolLM2 load); the tokenizer reads them and meets any bad one."""
    writer = gguf.GGUFWriter(str(tmp_path / "ok.gguf"), "llama")
    writer.add_token_list(["a", "é", "c"])
    writer.add_tensor("output_norm.weight", np.arange(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    good = (tmp_path / "ok.gguf").read_bytes()
    tokens = read_header(tmp_path / "ok.gguf").metadata["tokenizer.ggml.tokens"]
    assert (len(tokens), tokens[1], list(tokens), tokens[::2]) == (3, "é", ["a", "é", "c"], ["a", "c"])
    assert tokens == ("a", "é", "c") and tokens != ["a"] and repr(tokens) == "GGUFStrings(3 strings)"
    bad = write_bytes(tmp_path, good.replace("é".encode(), b"\xff\xfe"))
    tokens = read_header(bad).metadata["tokenizer.ggml.tokens"]  # the header alone still parses
    assert len(tokens) == 3
    with pytest.raises(CheckpointFormatError,
                       match=r"bad\.gguf: metadata key 'tokenizer\.ggml\.tokens': item 1 is not valid UTF-8"):
        tokens[0]


def test_tensor_data_past_the_end_of_the_file_names_the_tensor(tmp_path):
    full = small_file(tmp_path / "full.gguf").read_bytes()
    path = write_bytes(tmp_path, full[:-100])
    with pytest.raises(CheckpointFormatError,
                       match=r"bad\.gguf: tensor 'token_embd\.weight' data runs past the end of the file"):
        read_header(path)


def test_absurd_tensor_count_fails_before_allocating(tmp_path):
    path = write_bytes(tmp_path, raw_header(tensor_count=2**60) + b"\0" * 32)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFormatError,
                           match=r"bad\.gguf: truncated or corrupt file: tensor count 1152921504606846976 needs"):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_absurd_metadata_count_is_refused(tmp_path):
    path = write_bytes(tmp_path, raw_header(kv_count=2**50) + b"\0" * 32)
    with pytest.raises(CheckpointFormatError,
                       match=r"truncated or corrupt file: metadata count 1125899906842624 needs at least"):
        read_header(path)


def test_absurd_string_length_fails_before_allocating(tmp_path):
    kv = gguf_string("general.architecture") + struct.pack("<I", 8) + gguf_string(b"llama", length=2**62)
    path = write_bytes(tmp_path, raw_header(kv_count=1, kv=kv))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFormatError,
                           match=r"truncated or corrupt file: metadata key 'general\.architecture' claims a string of "
                                 r"4611686018427387904 bytes"):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


@pytest.mark.parametrize(("item_type", "label"), [(4, "uint32"), (8, "string")])
def test_absurd_array_length_fails_before_allocating(tmp_path, item_type, label):
    kv = gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, item_type, 2**61) + b"\0" * 16
    path = write_bytes(tmp_path, raw_header(kv_count=1, kv=kv), f"{label}.gguf")
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointFormatError,
                           match=r"truncated or corrupt file: metadata key 'tokenizer\.ggml\.tokens' claims an array "
                                 r"of 2305843009213693952 items"):
            read_header(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_duplicate_metadata_key_is_refused(tmp_path):
    one = gguf_string("general.name") + struct.pack("<I", 8) + gguf_string("x")
    path = write_bytes(tmp_path, raw_header(kv_count=2, kv=one + one))
    with pytest.raises(CheckpointFormatError, match="metadata key 'general.name' appears twice"):
        read_header(path)


def test_unknown_metadata_value_type_is_refused(tmp_path):
    kv = gguf_string("general.name") + struct.pack("<I", 77) + b"\0" * 16
    path = write_bytes(tmp_path, raw_header(kv_count=1, kv=kv))
    with pytest.raises(CheckpointFormatError, match="metadata key 'general.name' has unknown value type 77"):
        read_header(path)


def tensor_entry(name: str, dims: tuple[int, ...], ggml_type: int, offset: int = 0) -> bytes:
    return (gguf_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
            + struct.pack("<IQ", ggml_type, offset))


def test_unknown_ggml_type_id_names_tensor_and_type(tmp_path):
    entry = tensor_entry("blk.0.attn_q.weight", (32, 2), 999)
    path = write_bytes(tmp_path, raw_header(tensor_count=1, tensors=entry) + b"\0" * 512)
    with pytest.raises(UnsupportedError, match=r"tensor 'blk\.0\.attn_q\.weight' has ggml type 999"):
        read_header(path)


def test_too_many_dimensions_is_refused(tmp_path):
    entry = tensor_entry("x.weight", (1, 1, 1, 1, 1), 0)
    path = write_bytes(tmp_path, raw_header(tensor_count=1, tensors=entry) + b"\0" * 64)
    with pytest.raises(CheckpointFormatError, match="tensor 'x.weight' has 5 dimensions; GGUF allows 1 to 4"):
        read_header(path)


def test_rows_not_a_whole_number_of_blocks_are_refused(tmp_path):
    entry = tensor_entry("x.weight", (48, 2), int(Q.Q4_0))
    path = write_bytes(tmp_path, raw_header(tensor_count=1, tensors=entry) + b"\0" * 512)
    with pytest.raises(CheckpointFormatError, match="rows of 48 values, not a multiple of the Q4_0 block size 32"):
        read_header(path)


def test_bad_alignment_is_refused(tmp_path):
    kv = gguf_string("general.alignment") + struct.pack("<II", 4, 24)
    path = write_bytes(tmp_path, raw_header(kv_count=1, kv=kv) + b"\0" * 64)
    with pytest.raises(CheckpointFormatError, match="'general.alignment' is 24; expected a power of two"):
        read_header(path)


def test_sniff_reports_version_of_a_valid_file(tmp_path):
    assert sniff(small_file(tmp_path / "ok.gguf")) == 3


def test_every_header_error_is_a_load_error():
    assert issubclass(CheckpointFormatError, LoadError)
    assert issubclass(UnsupportedError, LoadError)
