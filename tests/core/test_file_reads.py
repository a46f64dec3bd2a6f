"""``loader.io.read_file_range``: a path's bytes at an offset, whole or a named truncation error; large reads in
pieces on the I/O pool land exactly where one read would put them."""

from __future__ import annotations

from pathlib import Path

import pytest

from loader._file_reads import PARALLEL_READ_CHUNK_BYTES, PARALLEL_READ_MIN_BYTES
from loader.errors import CheckpointFormatError
from loader.io import read_file_range


@pytest.mark.parametrize("length", [1, 4096, PARALLEL_READ_MIN_BYTES + PARALLEL_READ_CHUNK_BYTES // 2 + 3])
def test_the_range_is_read_whole_and_in_place(tmp_path: Path, length: int) -> None:
    data = bytes((i * 7 + i // 251) % 256 for i in range(length + 100))
    path = tmp_path / "blob"
    path.write_bytes(data)
    dest = bytearray(length)
    read_file_range(str(path), memoryview(dest), 37, "tensor 'w'")
    assert bytes(dest) == data[37:37 + length]


def test_nothing_to_read_opens_nothing(tmp_path: Path) -> None:
    read_file_range(str(tmp_path / "absent"), memoryview(bytearray()), 0, "tensor 'w'")


@pytest.mark.parametrize("length", [4096, PARALLEL_READ_MIN_BYTES + 1])
def test_a_file_that_ends_early_names_the_file_the_tensor_and_the_bytes(tmp_path: Path, length: int) -> None:
    path = tmp_path / "short"
    path.write_bytes(b"x" * (length // 2))
    with pytest.raises(CheckpointFormatError) as info:
        read_file_range(str(path), memoryview(bytearray(length)), 0, "tensor 'w'")
    message = str(info.value)
    assert str(path) in message and "tensor 'w'" in message and "truncated" in message
    assert f"file ends at byte {length // 2}" in message
