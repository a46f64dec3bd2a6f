"""The core's reader of sharded-state part files: values back bit for bit, every bad header named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from loader._sharded.reader import iter_part_files, read_part_header
from loader._sharded.writer import write_safetensors
from loader.errors import CheckpointFormatError
from loader.weights import ReadStats


def _part(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    tensors = {"a.weight": torch.randn(6, 4, dtype=torch.bfloat16), "b.codes": torch.arange(5, dtype=torch.int32),
               "c.empty": torch.empty(0, 3)}
    path = tmp_path / "model-rank-0-part-0.safetensors"
    write_safetensors(path, list(tensors.items()))
    return path, tensors


def test_reads_what_the_writer_wrote(tmp_path: Path) -> None:
    path, tensors = _part(tmp_path)
    stats = ReadStats()
    read = {name: tensor for name, tensor in iter_part_files((str(path),), stats)}
    assert set(read) == set(tensors)
    for name, expected in tensors.items():
        assert torch.equal(read[name].read(), expected)
        out = torch.empty_like(expected)
        read[name].read_into(out)
        assert torch.equal(out, expected)
    assert torch.equal(read["a.weight"].narrow(0, 2, 3).read(), tensors["a.weight"][2:5])
    assert torch.equal(read["a.weight"].narrow(1, 1, 2).read(), tensors["a.weight"][:, 1:3])
    span = read["a.weight"].narrow(0, 1, 2).file_span()
    assert span is not None and span.nbytes == 2 * 4 * 2
    assert stats.bytes_read > 0


def _with_header(tmp_path: Path, header: object, data: bytes = b"", length: int | None = None) -> str:
    raw = json.dumps(header).encode() if not isinstance(header, bytes) else header
    path = tmp_path / "bad.safetensors"
    path.write_bytes((len(raw) if length is None else length).to_bytes(8, "little") + raw + data)
    return str(path)


_F32 = {"dtype": "F32", "shape": [1]}


@pytest.mark.parametrize(("header", "data", "length", "message"), [
    ({}, b"", 1 << 40, "header length 1099511627776 is more than the 100000000 bytes allowed"),
    (b"\xff{", b"", None, "header is not UTF-8"),
    ([1], b"", None, "header must be a JSON object of tensors, found an array"),
    ({"t": 3}, b"", None, "tensor 't': header entry must be an object with dtype, shape and data_offsets"),
    ({"t": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}, b"x", None, "tensor 't': unknown dtype 'Q4'"),
    ({"t": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"xxxx", None,
     "shape must be a list of non-negative integers"),
    ({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0]}}, b"xxxx", None,
     r"data_offsets must be \[begin, end\] integers"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"xxxx", None,
     r"data_offsets \[0, 4\] span 4 bytes, but shape \[2\] of F32 needs 8"),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"xxxx", None, "run past the end of the data"),
    # the layout rules every safetensors reader applies (the one parser): no overlap, no gap, no trailing bytes
    ({"a": {**_F32, "data_offsets": [0, 4]}, "b": {**_F32, "data_offsets": [2, 6]}}, b"x" * 6, None,
     "tensors 'a' .* and 'b' .* overlap"),
    ({"a": {**_F32, "data_offsets": [0, 4]}, "b": {**_F32, "data_offsets": [6, 10]}}, b"x" * 10, None,
     "a gap of 2 bytes"),
    ({"a": {**_F32, "data_offsets": [0, 4]}}, b"x" * 6, None, "the tensors cover 4 of the 6 bytes after the header"),
])
def test_bad_headers_are_named(tmp_path: Path, header: object, data: bytes, length: int | None,
                               message: str) -> None:
    path = _with_header(tmp_path, header, data, length)
    with pytest.raises(CheckpointFormatError, match=message) as info:
        read_part_header(path)
    assert str(info.value).startswith(path)


def test_a_file_shorter_than_the_length_prefix_is_named(tmp_path: Path) -> None:
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"abc")
    with pytest.raises(CheckpointFormatError, match="short.safetensors: file is 3 bytes, too short for a safetensors"):
        read_part_header(str(path))


def test_a_file_truncated_after_the_header_was_read_is_named(tmp_path: Path) -> None:
    path, _ = _part(tmp_path)
    tensors = dict(iter_part_files((str(path),), ReadStats()))
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CheckpointFormatError, match="tensor 'b.codes': file ends at byte .* the file is truncated"):
        tensors["b.codes"].read()
