"""Strict header validation: each malformed case fails with a message naming file and tensor."""

from __future__ import annotations

import json
import struct

import pytest

from loader.errors import CheckpointFormatError, UnsupportedError
from loader_plugin_safetensors import MAX_HEADER_BYTES, open_checkpoint_file, read_header


def _write(path, header, data=b"", *, raw_header=None):
    """A safetensors file from a header object (or raw header bytes) and data bytes."""
    body = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


def _entry(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def test_valid_header_parses_metadata_and_orders_tensors_by_offset(tmp_path):
    path = _write(tmp_path / "ok.safetensors",
                  {"b": _entry(offsets=(8, 16)), "__metadata__": {"format": "pt"}, "a": _entry()},
                  bytes(16))
    header = read_header(path)
    assert list(header.tensors) == ["a", "b"]
    assert header.metadata == {"format": "pt"}
    assert header.tensors["b"].begin == header.data_start + 8
    assert header.file_size == path.stat().st_size


def _fails(path, *fragments, error=CheckpointFormatError):
    with pytest.raises(error) as info:
        open_checkpoint_file(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_file_too_short(tmp_path):
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x02")
    _fails(path, "2 bytes, too short")


def test_header_length_beyond_file(tmp_path):
    path = tmp_path / "cut.safetensors"
    path.write_bytes(struct.pack("<Q", 500) + b"{}")
    _fails(path, "header length 500 runs past the end of the file (10 bytes)")


def test_header_length_absurd(tmp_path):
    path = tmp_path / "huge.safetensors"
    path.write_bytes(struct.pack("<Q", MAX_HEADER_BYTES + 1) + b"{}")
    _fails(path, f"header length {MAX_HEADER_BYTES + 1} is more than the {MAX_HEADER_BYTES} bytes allowed")


def test_header_not_utf8(tmp_path):
    path = _write(tmp_path / "latin.safetensors", None, raw_header=b'{"\xff": 1}')
    _fails(path, "header is not UTF-8")


def test_header_not_json(tmp_path):
    path = _write(tmp_path / "text.safetensors", None, raw_header=b"{not json")
    _fails(path, "header is not valid JSON")


def test_header_not_an_object(tmp_path):
    path = _write(tmp_path / "list.safetensors", [1, 2])
    _fails(path, "header must be a JSON object of tensors, found an array")


def test_unknown_dtype(tmp_path):
    path = _write(tmp_path / "dt.safetensors", {"w": _entry(dtype="F7")}, bytes(8))
    _fails(path, "tensor 'w'", "unknown dtype 'F7'", "F32", "BF16")


def test_sub_byte_dtype_is_unsupported(tmp_path):
    path = _write(tmp_path / "f4.safetensors", {"w": _entry(dtype="F4", shape=(2,), offsets=(0, 1))},
                  bytes(1))
    _fails(path, "tensor 'w'", "dtype F4", error=UnsupportedError)


@pytest.mark.parametrize("shape", [[2, -1], [2.0], "2", [True], None])
def test_shape_not_non_negative_ints(tmp_path, shape):
    header = {"w": {"dtype": "F32", "shape": shape, "data_offsets": [0, 8]}}
    path = _write(tmp_path / "shape.safetensors", header, bytes(8))
    _fails(path, "tensor 'w'", "shape must be a list of non-negative integers")


@pytest.mark.parametrize("offsets", [[0], [0, 8, 9], [8, 0], [-8, 0], [0, "8"], [0.0, 8], "0-8"])
def test_data_offsets_not_begin_end_ints(tmp_path, offsets):
    header = {"w": {"dtype": "F32", "shape": [2], "data_offsets": offsets}}
    path = _write(tmp_path / "offs.safetensors", header, bytes(8))
    _fails(path, "tensor 'w'", "data_offsets must be [begin, end] integers")


def test_span_not_numel_times_itemsize(tmp_path):
    path = _write(tmp_path / "span.safetensors", {"w": _entry(dtype="BF16", shape=(2, 3), offsets=(0, 8))},
                  bytes(8))
    _fails(path, "tensor 'w'", "span 8 bytes", "BF16 needs 12")


def test_offsets_past_the_data(tmp_path):
    path = _write(tmp_path / "past.safetensors", {"w": _entry(offsets=(4, 12))}, bytes(10))
    _fails(path, "tensor 'w'", "past the end of the data (10 bytes after the header)")


def test_overlapping_tensors(tmp_path):
    path = _write(tmp_path / "overlap.safetensors", {"a": _entry(), "b": _entry(offsets=(4, 12))}, bytes(12))
    _fails(path, "tensors 'a'", "'b'", "overlap")


def test_zero_size_tensors_may_share_an_offset(tmp_path):
    header = {"a": _entry(shape=(0,), offsets=(0, 0)), "b": _entry(shape=(0, 4), offsets=(0, 0)),
              "c": _entry()}
    path = _write(tmp_path / "empty.safetensors", header, bytes(8))
    assert len(open_checkpoint_file(path)) == 3


def test_duplicate_tensor_name_in_one_file(tmp_path):
    raw = (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
           b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}')
    path = _write(tmp_path / "dup.safetensors", None, bytes(8), raw_header=raw)
    _fails(path, "tensor 'w' appears twice in the header")


def test_entry_missing_a_field(tmp_path):
    path = _write(tmp_path / "miss.safetensors", {"w": {"dtype": "F32", "shape": [2]}}, bytes(8))
    _fails(path, "tensor 'w'", "lacks 'data_offsets'")


def test_entry_not_an_object(tmp_path):
    path = _write(tmp_path / "str.safetensors", {"w": "F32"}, bytes(8))
    _fails(path, "tensor 'w'", "must be an object", "found a string")


@pytest.mark.parametrize("metadata", [["a"], {"k": 1}])
def test_metadata_must_be_strings(tmp_path, metadata):
    path = _write(tmp_path / "meta.safetensors", {"__metadata__": metadata, "w": _entry()}, bytes(8))
    _fails(path, "__metadata__ must")


def test_missing_file(tmp_path):
    _fails(tmp_path / "nope.safetensors", "cannot open")
