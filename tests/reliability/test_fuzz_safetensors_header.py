"""Fuzzing the safetensors header parser and reader: any bytes parse or raise a LoadError, never anything else.

Three harnesses: structured JSON headers (mostly consistent, one field
disturbed), raw bytes through :func:`read_header` (length field included), and
random damage to a valid file followed by reading every tensor -- that file drawn
from a seed corpus: our own valid file and every file of the reference reader's
tests (:mod:`tests.helpers.safetensors_reference_files`). When a header
parses, the invariants the readers rely on are checked too. Settings: the
``loader-fuzz`` profile (tests/reliability/conftest.py).
"""

from __future__ import annotations

import itertools
import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from loader.checkpoint import parse_safetensors_header as parse_header
from loader.errors import LoadError
from loader_plugin_safetensors import DTYPES, SafetensorsHeader, open_checkpoint_file, read_header
from tests.helpers.malformed import safetensors_bytes_of
from tests.helpers.safetensors_reference_files import REFERENCE_FILES
from tests.reliability.conftest import FUZZ_PROFILE
from tests.reliability.fuzz_values import EXTREME_INTS, json_values

FUZZ = settings(parent=settings.get_profile(FUZZ_PROFILE))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-safetensors")

CODES = st.sampled_from(sorted(DTYPES))
BAD_CODES = st.sampled_from(["F4", "F6_E2M3", "Q4_K", "", "f32", "BF16 ", "F8"]) | json_values(2)


def check_invariants(header: SafetensorsHeader) -> None:
    """What every reader trusts once a header is accepted."""
    spans = []
    for info in header.tensors.values():
        assert header.data_start <= info.begin <= info.end <= header.file_size
        assert info.nbytes == info.numel() * info.dtype.itemsize
        spans.append((info.begin, info.end))
    spans.sort()
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert end == begin, "accepted overlapping tensors, or a gap between two"
    # the reference reader's rules: the data starts with the first tensor and ends with the last
    assert (spans[0][0] if spans else header.data_start) == header.data_start
    assert (spans[-1][1] if spans else header.data_start) == header.file_size, "accepted uncovered bytes"


@st.composite
def headers(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A consistent header (contiguous offsets) with, usually, one field replaced by something hostile."""
    count = draw(st.integers(0, 5))
    header: dict[str, Any] = {}
    offset = 0
    for i in range(count):
        code = draw(CODES)
        shape = draw(st.lists(st.integers(0, 6), max_size=3))
        size = DTYPES[code].itemsize
        for s in shape:
            size *= s
        header[draw(st.text(max_size=6)) or f"t{i}"] = {"dtype": code, "shape": shape,
                                                       "data_offsets": [offset, offset + size]}
        offset += size
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4) | json_values(2),
                                                      max_size=3))
    names = [n for n in header if n != "__metadata__"]
    if names and draw(st.integers(0, 4)):
        victim = header[draw(st.sampled_from(names))]
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", "whole", "drop"]))
        if field == "dtype":
            victim["dtype"] = draw(BAD_CODES | CODES)
        elif field == "shape":
            victim["shape"] = draw(st.lists(st.integers(-3, 8) | EXTREME_INTS, max_size=4) | json_values(3))
        elif field == "data_offsets":
            victim["data_offsets"] = draw(st.lists(st.integers(-3, offset + 8) | EXTREME_INTS, max_size=3)
                                          | json_values(3))
        elif field == "drop":
            victim.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])))
        else:
            victim.clear()
            victim.update(draw(st.dictionaries(st.text(max_size=5), json_values(3), max_size=3)))
    data_size = offset + draw(st.sampled_from([0, 0, 0, -1, 1, -offset]))
    return header, max(data_size, 0)


@FUZZ
@given(headers())
def test_structured_headers_parse_or_raise_load_error(case: tuple[dict[str, Any], int]) -> None:
    header, data_size = case
    raw = json.dumps(header).encode()
    try:
        parsed = parse_header(raw, "fuzz.safetensors", 8 + len(raw) + data_size)
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert "fuzz.safetensors" in str(exc)
        return
    event("accepted")
    check_invariants(parsed)


@FUZZ
@given(st.binary(max_size=64), st.integers(0, 200) | EXTREME_INTS, st.binary(max_size=64))
def test_raw_bytes_read_or_raise_load_error(scratch: Path, body: bytes, length: int, tail: bytes) -> None:
    path = scratch / "raw.safetensors"
    path.write_bytes(struct.pack("<Q", length % (1 << 64)) + body + tail)
    try:
        parsed = read_header(path)
    except LoadError as exc:
        assert str(path) in str(exc)
        return
    check_invariants(parsed)


_VALID = safetensors_bytes_of({"a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
                               "b": torch.ones(4, dtype=torch.bfloat16), "c": torch.zeros(0, 2),
                               "d": torch.tensor(7, dtype=torch.int64)})


SEED_CORPUS = [_VALID, *(f.blob for f in REFERENCE_FILES)]


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A seed with up to four runs of bytes overwritten (often in its data), sometimes cut short."""
    blob = bytearray(draw(st.sampled_from(SEED_CORPUS)))
    data_start = min(8 + struct.unpack_from("<Q", blob)[0], len(blob)) if len(blob) >= 8 else 0
    positions = st.integers(0, max(len(blob) - 1, 0)) | st.integers(min(data_start, max(len(blob) - 1, 0)),
                                                                     max(len(blob) - 1, 0))
    for _ in range(draw(st.integers(0, 4))):
        at = draw(positions)
        raw = draw(st.binary(min_size=1, max_size=8))
        blob[at:at + len(raw)] = raw
    keep = draw(st.integers(0, len(blob)))
    return bytes(blob[:keep]) if keep < len(blob) // 2 else bytes(blob)


@FUZZ
@given(damaged())
def test_damaged_file_reads_every_tensor_or_raises_load_error(scratch: Path, blob: bytes) -> None:
    path = scratch / "damaged.safetensors"
    path.write_bytes(blob)
    try:
        checkpoint = open_checkpoint_file(path)
        check_invariants(checkpoint.header)
        with checkpoint:
            for _, tensor in checkpoint.tensors():
                values = tensor.read()
                assert tuple(values.shape) == tensor.shape
                out = torch.empty(tensor.shape, dtype=torch.float32)
                tensor.read_into(out)
        event("accepted and read")
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(path) in str(exc) or "safetensors dtype" in str(exc)
