"""The one safetensors header parser, public in ``loader.checkpoint``, through a ranged reader.

Every rule is tested on local files in ``tests/plugins/safetensors/test_header.py``
(the safetensors plugin reads through this parser); here, what a remote reader
relies on: exactly two reads (the length, then the header) and never a byte of
tensor data, short reads asked again, and the header-only tensor handle.
"""

from __future__ import annotations

import pytest
import torch

from loader.checkpoint import SAFETENSORS_DTYPES, read_safetensors_header
from loader.errors import CheckpointFormatError
from loader.weights import HeaderOnlyTensor
from tests.helpers.malformed import safetensors_bytes_of


def _blob() -> bytes:
    return safetensors_bytes_of({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                                 "b": torch.ones(4, dtype=torch.bfloat16)})


def test_two_reads_and_no_tensor_byte() -> None:
    blob = _blob()
    asked: list[tuple[int, int]] = []

    def read_range(start: int, length: int) -> bytes:
        asked.append((start, length))
        return blob[start:start + length]

    header = read_safetensors_header(read_range, len(blob), "mem://x")
    length = int.from_bytes(blob[:8], "little")
    assert asked == [(0, 8), (8, length)]
    assert header.data_start == 8 + length
    assert [(t.name, t.dtype.code, t.shape) for t in header.tensors.values()] == [("a", "F32", (2, 3)),
                                                                                 ("b", "BF16", (4,))]


def test_short_reads_are_asked_again() -> None:
    blob = _blob()
    header = read_safetensors_header(lambda start, length: blob[start:start + min(length, 5)], len(blob), "x")
    assert list(header.tensors) == ["a", "b"]


def test_a_reader_ending_early_is_named() -> None:
    blob = _blob()
    with pytest.raises(CheckpointFormatError, match="^mem://x: file ended while reading the header$"):
        read_safetensors_header(lambda start, length: blob[start:min(start + length, 20)], len(blob), "mem://x")


def test_a_size_other_than_the_data_is_refused() -> None:
    blob = _blob()
    with pytest.raises(CheckpointFormatError, match="safetensors requires the data to be fully covered"):
        read_safetensors_header(lambda start, length: blob[start:start + length], len(blob) + 4, "x")


def test_header_only_tensors_narrow_but_never_read() -> None:
    tensor = HeaderOnlyTensor("w", "mem://x", SAFETENSORS_DTYPES["BF16"], (4, 6))
    assert tensor.dtype == torch.bfloat16 and tensor.stored_type == "bfloat16" and tensor.nbytes == 48
    part = tensor.narrow(1, 2, 3)
    assert part.shape == (4, 3) and part.nbytes == 24
    with pytest.raises(RuntimeError, match="tensor 'w' in mem://x: only its header was read"):
        part.read()
