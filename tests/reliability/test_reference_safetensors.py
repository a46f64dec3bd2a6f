"""The safetensors reference reader's own test files through loader's safetensors reader.

Each file of :data:`tests.helpers.safetensors_reference_files.REFERENCE_FILES` (the Rust crate's
``tensor.rs`` tests and the Python binding's file-format tests) goes through
:func:`loader_plugin_safetensors.open_checkpoint_file`, i.e. the one header parser
(``core/loader/_safetensors_header.py``) every safetensors read uses, then every tensor is read.
The expected verdict is the reference's: a file it accepts loads with the names, dtypes, shapes,
bytes and metadata it holds; a file it refuses fails with one named :class:`LoadError` whose
message says what is wrong. ``slice.rs``'s slicing cases run through ``narrow``. Where loader
refuses a file the reference accepts on purpose, the file is in :data:`DELIBERATE_DIFFERENCES`
with the reason (docs/reliability.md lists them too). The recorded verdicts are checked against
the ``safetensors`` package itself where it is installed.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import attrs
import pytest
import torch

from loader.errors import CheckpointFormatError, LoadError, UnsupportedError
from loader_plugin_safetensors import open_checkpoint_file
from tests.helpers.safetensors_reference_files import REFERENCE_FILES, ReferenceFile, Stored, encode

BY_ID = {f.id: f for f in REFERENCE_FILES}


@attrs.frozen
class Refused:
    """How loader refuses a file: the error class and a pattern its message must match."""

    error: type[LoadError]
    message: str


_SUB_BYTE = r"dtype F4 \(packed sub-byte elements\) is not supported"
# Loader's verdict on each file, ``None`` where it loads.
LOADER_VERDICTS: dict[str, Refused | None] = {
    "deserialization": None, "empty-shape": None, "zero-sized-tensor": None, "whitespace-after-header": None,
    "whitespace-before-header": None,
    "json-attack-same-offsets": Refused(CheckpointFormatError,
                                        r"tensors 'weight_\d' \(data_offsets \[0, 16\]\) and 'weight_\d' "
                                        r"\(data_offsets \[0, 16\]\) overlap"),
    "bytes-after-the-data": Refused(CheckpointFormatError, r"the tensors cover 16 of the 50 bytes after the header"),
    "data-two-bytes-short": Refused(CheckpointFormatError,
                                    r"tensor 'test': data_offsets \[0, 16\] run past the end of the data "
                                    r"\(14 bytes after the header\)"),
    "header-too-large": Refused(CheckpointFormatError,
                                r"header length 18446742974197923900 is more than the 100000000 bytes allowed"),
    "header-too-small": Refused(CheckpointFormatError, r"file is 0 bytes, too short for a safetensors file"),
    "header-length-beyond-file": Refused(CheckpointFormatError,
                                         r"header length 60 runs past the end of the file \(8 bytes\)"),
    "header-not-utf8": Refused(CheckpointFormatError, r"header is not UTF-8 \(invalid start byte at byte 0\)"),
    "header-not-json": Refused(CheckpointFormatError, r"header is not valid JSON"),
    "span-not-the-shape": Refused(CheckpointFormatError,
                                  r"tensor 'test': data_offsets \[0, 4\] span 4 bytes, but shape \[2, 2\] of I32 "
                                  r"needs 16"),
    "shape-overflows-elements": Refused(CheckpointFormatError,
                                        r"span 16 bytes, but shape \[2, 18446744073709551614\] of I32 needs \d+"),
    "shape-overflows-bytes": Refused(CheckpointFormatError,
                                     r"span 16 bytes, but shape \[2, 9223372036854775807\] of I32 needs \d+"),
    "serialization": None, "forced-alignment": None, "empty": None, "empty-with-metadata": None,
    "roundtrip-every-byte-dtype": None,
    "fp4": Refused(UnsupportedError, rf"tensor 'attn.0': {_SUB_BYTE}"),
    "roundtrip-f6": Refused(UnsupportedError, r"tensor 'a': dtype F6_E2M3 \(packed sub-byte elements\) is not "
                                              r"supported"),
    "fp4-odd-count": Refused(UnsupportedError, rf"tensor 'attn.0': {_SUB_BYTE}"),
    "fp4-span-too-long": Refused(UnsupportedError, rf"tensor 'attn.0': {_SUB_BYTE}"),
    "py-serialization": None, "py-metadata": None, "py-forces-alignment": None, "py-bf16": None, "py-complex": None,
    "py-odd-dtypes": None, "py-fp8": None,
    "py-fp4": Refused(UnsupportedError, rf"tensor 'test2': {_SUB_BYTE}"),
    "py-zero-sized": None, "py-pread-round-trip": None,
    "py-pread-truncated-header": Refused(CheckpointFormatError, r"header length \d+ runs past the end of the file"),
    "py-pread-lying-offsets": Refused(CheckpointFormatError,
                                      r"tensor 'liar': data_offsets \[0, 4194304\] run past the end of the data "
                                      r"\(1 bytes after the header\)"),
}

_SUB_BYTE_REASON = ("the reference reads F4/F6 tensors (4- and 6-bit elements packed across bytes); loader has no "
                    "tensor type to hand a model for them (torch's float4_e2m1fn_x2 packs pairs, which changes "
                    "the shape), so it refuses the file by name (UnsupportedError) instead of loading packed "
                    "bytes under a wrong shape or dtype")
DELIBERATE_DIFFERENCES: dict[str, str] = {
    "fp4": _SUB_BYTE_REASON,
    "roundtrip-f6": _SUB_BYTE_REASON,
    "py-fp4": _SUB_BYTE_REASON,
}
"""Files the reference accepts and loader refuses on purpose, each with the reason."""


def _write(case: ReferenceFile, folder: Path) -> Path:
    path = folder / f"{case.id}.safetensors"
    path.write_bytes(case.blob)
    return path


def test_every_reference_file_has_a_verdict() -> None:
    assert sorted(LOADER_VERDICTS) == sorted(BY_ID)
    assert len(REFERENCE_FILES) == 37


@pytest.mark.parametrize("case", REFERENCE_FILES, ids=lambda c: c.id)
def test_loader_agrees_with_the_reference_or_says_why_not(case: ReferenceFile) -> None:
    loads = LOADER_VERDICTS[case.id] is None
    if case.id in DELIBERATE_DIFFERENCES:
        assert case.accepted and not loads, "a deliberate difference must be one"
    else:
        assert loads == case.accepted


@pytest.mark.parametrize("case", [f for f in REFERENCE_FILES if LOADER_VERDICTS[f.id] is not None],
                         ids=lambda c: c.id)
def test_a_file_loader_refuses_is_refused_by_name(case: ReferenceFile, tmp_path: Path) -> None:
    verdict = LOADER_VERDICTS[case.id]
    assert verdict is not None
    path = _write(case, tmp_path)
    with pytest.raises(verdict.error, match=verdict.message) as info, open_checkpoint_file(path) as checkpoint:
        for _, tensor in checkpoint.tensors():
            tensor.read()
    assert str(path) in str(info.value)


def _bytes_of(values: torch.Tensor) -> bytes:
    return bytes(values.reshape(-1).view(torch.uint8).numpy().tobytes()) if values.numel() else b""


@pytest.mark.parametrize("case", [f for f in REFERENCE_FILES if LOADER_VERDICTS[f.id] is None], ids=lambda c: c.id)
def test_a_file_the_reference_accepts_loads_with_its_tensors(case: ReferenceFile, tmp_path: Path) -> None:
    with open_checkpoint_file(_write(case, tmp_path)) as checkpoint:
        assert dict(checkpoint.metadata) == (case.metadata or {})
        found = {name: tensor for name, tensor in checkpoint.tensors()}
        assert sorted(found) == sorted(case.tensors)
        for name, stored in case.tensors.items():
            tensor = found[name]
            assert (tensor.info.dtype.code, tensor.shape) == (stored.dtype, stored.shape), name
            assert _bytes_of(tensor.read()) == stored.data, name


_DATA = torch.arange(6, dtype=torch.float32)


@pytest.mark.parametrize(("stored_shape", "narrows", "expected"), [
    ((1, 2, 3), [(1, 0, 1)], _DATA[:3].reshape(1, 1, 3)),  # tensor.rs::test_slicing, slice.rs::test_helpers
    ((1, 2, 3), [(2, 0, 1)], _DATA[[0, 3]].reshape(1, 2, 1)),  # test_slicing, slice.rs::test_slice_variety
    ((1, 2, 3), [(0, 0, 1)], _DATA.reshape(1, 2, 3)),  # slice.rs::test_slice_variety, test_dummy
    ((1, 2, 3), [(1, 1, 1), (2, 0, 1)], _DATA[[3]].reshape(1, 1, 1)),  # slice.rs::test_slice_variety
    ((2, 3), [(1, 1, 2)], _DATA.reshape(2, 3)[:, 1:3]),  # slice.rs::test_slice_variety2
    ((2, 3), [(0, 1, 1), (1, 1, 2)], _DATA[4:6].reshape(1, 2)),  # slice.rs::test_slice_select (row 1)
    ((2, 3), [(0, 0, 1), (1, 1, 2)], _DATA[1:3].reshape(1, 2)),  # slice.rs::test_slice_select (row 0)
    ((2, 3), [(0, 1, 1), (1, 0, 1)], _DATA[[3]].reshape(1, 1)),  # slice.rs::test_slice_select
], ids=["rows-0", "last-dim-0", "first-dim-whole", "two-dims", "columns-1-3", "row-1-columns-1-3",
        "row-0-columns-1-3", "row-1-column-0"])
def test_a_slice_reads_the_bytes_the_reference_slices(stored_shape: tuple[int, ...],
                                                      narrows: list[tuple[int, int, int]], expected: torch.Tensor,
                                                      tmp_path: Path) -> None:
    path = tmp_path / "attn.safetensors"
    path.write_bytes(encode({"attn": Stored("F32", stored_shape, _DATA.numpy().tobytes())}))
    with open_checkpoint_file(path) as checkpoint:
        (_, tensor), = checkpoint.tensors()
        for dim, start, length in narrows:
            tensor = tensor.narrow(dim, start, length)
        assert torch.equal(tensor.read(), expected)


@pytest.mark.parametrize(("dim", "start", "length", "message"), [
    (1, 1, 3, r"slice \[1, 4\) is outside dim 1 of size 3"),  # slice.rs::test_invalid_range
    (2, 0, 1, r"cannot narrow dim 2 of shape \(2, 3\)"),  # slice.rs::test_invalid_range (too many slices)
])
def test_a_slice_the_reference_refuses_is_refused_by_name(dim: int, start: int, length: int, message: str,
                                                          tmp_path: Path) -> None:
    path = tmp_path / "attn.safetensors"
    path.write_bytes(encode({"attn": Stored("F32", (2, 3), _DATA.numpy().tobytes())}))
    with open_checkpoint_file(path) as checkpoint:
        (_, tensor), = checkpoint.tensors()
        with pytest.raises(CheckpointFormatError, match=message):
            tensor.narrow(dim, start, length)


@pytest.mark.parametrize("n_heads", [12, 6], ids=["gpt2", "gpt2_tiny"])
def test_a_gpt2_sized_file_reads_its_header_and_last_tensor(n_heads: int, tmp_path: Path) -> None:
    """tensor.rs::gpt2_like (test_gpt2, test_gpt2_tiny): 0.5 GB of zeros, written sparse."""
    shapes: dict[str, list[int]] = {"wte": [50257, 768], "wpe": [1024, 768]}
    for i in range(n_heads):
        for part, shape in (("ln_1.weight", [768]), ("ln_1.bias", [768]), ("attn.bias", [1, 1, 1024, 1024]),
                            ("attn.c_attn.weight", [768, 2304]), ("attn.c_attn.bias", [2304]),
                            ("attn.c_proj.weight", [768, 768]), ("attn.c_proj.bias", [768]),
                            ("ln_2.weight", [768]), ("ln_2.bias", [768]), ("mlp.c_fc.weight", [768, 3072]),
                            ("mlp.c_fc.bias", [3072]), ("mlp.c_proj.weight", [3072, 768]),
                            ("mlp.c_proj.bias", [768])):
            shapes[f"h.{i}.{part}"] = shape
    shapes |= {"ln_f.weight": [768], "ln_f.bias": [768]}
    header: dict[str, object] = {}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * int(torch.tensor(shape).prod())
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path = tmp_path / "gpt2.safetensors"
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)
    with open_checkpoint_file(path) as checkpoint:
        assert sorted(checkpoint.names()) == sorted(shapes)
        assert torch.equal(dict(checkpoint.tensors())["ln_f.bias"].read(), torch.zeros(768))


@pytest.mark.parametrize("case", REFERENCE_FILES, ids=lambda c: c.id)
def test_the_reference_library_gives_the_recorded_verdict(case: ReferenceFile) -> None:
    safetensors = pytest.importorskip("safetensors")
    try:
        safetensors.deserialize(case.blob)
    except safetensors.SafetensorError:
        assert not case.accepted
    else:
        assert case.accepted


def test_complex_values_are_refused_for_a_real_destination(tmp_path: Path) -> None:
    """test_complex's C64 file read into float32 would lose the imaginary part (-1+1j becomes -1): refused by name."""
    path = _write(BY_ID["py-complex"], tmp_path)
    with open_checkpoint_file(path) as checkpoint:
        (_, tensor), = checkpoint.tensors()
        with pytest.raises(CheckpointFormatError, match=r"tensor 'test' in .*py-complex.safetensors holds complex "
                                                        r"values \(complex64\); reading them into float32 would drop "
                                                        r"their imaginary part"):
            tensor.read_into(torch.empty(2, 2))
        out = torch.empty(2, 2, dtype=torch.complex128)
        tensor.read_into(out)
        assert out[1, 1] == complex(-1.0, 1.0)
