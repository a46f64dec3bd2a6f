"""llama.cpp's handcrafted GGUF files (``tests/test-gguf.cpp``) through loader's GGUF reader.

Every ``HANDCRAFTED_*`` kind of ggml's test is written by :mod:`tests.helpers.gguf_reference_files`
and read by :func:`loader_plugin_gguf.format.header.read_header` (what every GGUF load, inspect
and split-file check goes through). The expected verdict is ggml's: ``gguf_init_from_file``
returns a context for the ``*_SUCCESS``, ``*_CUSTOM_ALIGN`` and ``TENSORS_ZERO_DIM`` kinds and
null for the rest (``Kind.ggml_accepts``). A file ggml accepts loads here with the tensors,
offsets and bytes it declares; a file ggml refuses fails with one named :class:`LoadError`
whose message says what is wrong. Where loader refuses a file ggml accepts on purpose, the kind
is in :data:`DELIBERATE_DIFFERENCES` with the reason (docs/reliability.md lists them too).

The verdicts were checked against ggml itself (``tests/helpers/ggml_verdict.py``):
``test_ggml_gives_the_recorded_verdicts`` reruns that check where ``LOADER_GGML_LIB`` names a
``libggml-base.so``, and is skipped otherwise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch

from loader.errors import CheckpointFormatError, LoadError, UnsupportedError
from loader.weights import ReadStats
from loader_plugin_gguf.format.dequantize import FLOAT_TYPES, is_supported
from loader_plugin_gguf.format.header import read_header
from loader_plugin_gguf.format.tensors import GGUFTensor, MappedFile
from tests.helpers.gguf_reference_files import GGML_BLOCK_SIZES, Kind, write_handcrafted

SEED = 0
HUGE = str(2**64 - 1)


@attrs.frozen
class Refused:
    """How loader refuses a file: the error class and a pattern its message must match."""

    error: type[LoadError]
    message: str


# Loader's verdict on each kind, ``None`` where the file loads.
LOADER_VERDICTS: dict[Kind, Refused | None] = {
    Kind.HEADER_BAD_MAGIC: Refused(CheckpointFormatError, r"not a GGUF file: starts with b'FUGG'"),
    Kind.HEADER_BAD_VERSION_0: Refused(UnsupportedError, r"GGUF version 0 is not supported"),
    Kind.HEADER_BAD_VERSION_1: Refused(UnsupportedError, r"GGUF version 1 is not supported"),
    Kind.HEADER_BAD_VERSION_FUTURE: Refused(UnsupportedError, r"GGUF version 4 is not supported"),
    Kind.HEADER_BAD_N_TENSORS: Refused(CheckpointFormatError, rf"tensor count {HUGE} needs at least"),
    Kind.HEADER_BAD_N_KV: Refused(CheckpointFormatError, rf"metadata count {HUGE} needs at least"),
    Kind.HEADER_EMPTY: None,
    Kind.KV_BAD_KEY_SIZE: Refused(CheckpointFormatError, rf"the name of metadata key #0 claims a string of {HUGE}"),
    Kind.KV_EMPTY_KEY: Refused(CheckpointFormatError, r"metadata key #0 has an empty name"),
    Kind.KV_BAD_TYPE: Refused(CheckpointFormatError, r"metadata key 'my_key_0' has unknown value type 13"),
    Kind.KV_DUPLICATE_KEY: Refused(CheckpointFormatError, r"metadata key 'my_key_0' appears twice"),
    Kind.KV_BAD_ALIGN: Refused(CheckpointFormatError, r"'general.alignment' is 13; expected a power of two"),
    Kind.KV_WRONG_TYPE_ALIGN: Refused(CheckpointFormatError,
                                      r"'general.alignment' has value type INT32; expected UINT32"),
    Kind.KV_SUCCESS: None,
    Kind.TENSORS_BAD_NAME_SIZE: Refused(CheckpointFormatError,
                                        r"the name of tensor #0 is 87 bytes long; ggml allows at most 63"),
    Kind.TENSORS_BAD_N_DIMS: Refused(CheckpointFormatError, r"tensor 'my_tensor_0' has 5 dimensions"),
    Kind.TENSORS_BAD_SHAPE: Refused(CheckpointFormatError, r"tensor 'my_tensor_0' has a negative dimension \(-1\)"),
    Kind.TENSORS_ZERO_DIM: None,
    Kind.TENSORS_NE_TOO_BIG: Refused(CheckpointFormatError,
                                     r"tensor 'my_tensor_0' has more elements than ggml can count"),
    Kind.TENSORS_NBYTES_TOO_BIG: Refused(CheckpointFormatError,
                                         rf"tensor 'my_tensor_0' of shape \[\d+, \d+(, \d+)*\] needs \d+ bytes, "
                                         rf"more than ggml can address \({HUGE}\)"),
    Kind.TENSORS_BAD_TYPE: Refused(UnsupportedError, r"tensor 'my_tensor_0' has ggml type 43, which no GGUF"),
    Kind.TENSORS_BAD_OFFSET: Refused(CheckpointFormatError,
                                     rf"tensor 'my_tensor_0' starts at data offset {HUGE}, not a multiple"),
    Kind.TENSORS_DUPLICATE_NAME: Refused(CheckpointFormatError, r"tensor 'my_tensor' appears twice"),
    Kind.TENSORS_BAD_ALIGN: Refused(CheckpointFormatError, r"'general.alignment' is 13; expected a power of two"),
    # the table holds no data: loader names the first tensor the file lacks (DATA_INCONSISTENT_ALIGN: the offsets)
    Kind.TENSORS_INCONSISTENT_ALIGN: Refused(CheckpointFormatError,
                                             r"tensor 'my_tensor_0' data runs past the end of the file"),
    Kind.TENSORS_SUCCESS: Refused(CheckpointFormatError, r"tensor 'my_tensor_0' data runs past the end of the file"),
    Kind.TENSORS_CUSTOM_ALIGN: Refused(CheckpointFormatError,
                                       r"tensor 'my_tensor_0' data runs past the end of the file"),
    Kind.DATA_NOT_ENOUGH_DATA: Refused(CheckpointFormatError,
                                       r"the data section \(every tensor padded to the alignment 32\) ends at "
                                       r"byte \d+, past the end of the file"),
    Kind.DATA_BAD_ALIGN: Refused(CheckpointFormatError, r"'general.alignment' is 13; expected a power of two"),
    Kind.DATA_INCONSISTENT_ALIGN: Refused(CheckpointFormatError,
                                          r"tensor 'my_tensor_\d+' starts at data offset \d+, not a multiple of "
                                          r"the alignment 32"),
    Kind.DATA_MEM_SIZE_OVERFLOW: Refused(CheckpointFormatError,
                                         r"tensor 'my_tensor_0' data runs past the end of the file"),
    Kind.DATA_SUCCESS: None,
    Kind.DATA_CUSTOM_ALIGN: None,
}

_NO_DATA = ("ggml accepts it because test-gguf.cpp asks for the header only (no ggml_context): the file "
            "declares tensors but holds none of their bytes. Loader always reads the data, so it refuses "
            "the file by name at once, as ggml itself does when the data is requested (DATA_NOT_ENOUGH_DATA)")
DELIBERATE_DIFFERENCES: dict[Kind, str] = {
    Kind.TENSORS_SUCCESS: _NO_DATA,
    Kind.TENSORS_CUSTOM_ALIGN: _NO_DATA,
}
"""Kinds ggml accepts and loader refuses on purpose, each with the reason."""

REFUSED = [kind for kind, verdict in LOADER_VERDICTS.items() if verdict is not None]
LOADED = [kind for kind, verdict in LOADER_VERDICTS.items() if verdict is None]


def test_every_kind_of_the_reference_has_a_verdict() -> None:
    assert set(LOADER_VERDICTS) == set(Kind)
    assert len(Kind) == 33


@pytest.mark.parametrize("kind", list(Kind), ids=lambda k: k.name)
def test_loader_agrees_with_ggml_or_says_why_not(kind: Kind) -> None:
    loads = LOADER_VERDICTS[kind] is None
    if kind in DELIBERATE_DIFFERENCES:
        assert kind.ggml_accepts and not loads, "a deliberate difference must be one"
    else:
        assert loads == kind.ggml_accepts


@pytest.mark.parametrize("kind", REFUSED, ids=lambda k: k.name)
def test_a_file_the_reference_refuses_is_refused_by_name(kind: Kind, tmp_path: Path) -> None:
    built = write_handcrafted(tmp_path / f"{kind.name}.gguf", kind, SEED)
    verdict = LOADER_VERDICTS[kind]
    assert verdict is not None
    with pytest.raises(verdict.error, match=verdict.message) as info:
        read_header(built.path)
    assert str(built.path) in str(info.value)


def _expected_bytes(offset: int, nbytes: int) -> torch.Tensor:
    """The generator's data: each byte is its position in the data section, mod 256."""
    return (torch.arange(offset, offset + nbytes, dtype=torch.int64) % 256).to(torch.uint8)


@pytest.mark.parametrize("kind", LOADED, ids=lambda k: k.name)
def test_a_file_the_reference_accepts_loads_with_its_tensors(kind: Kind, tmp_path: Path) -> None:
    built = write_handcrafted(tmp_path / f"{kind.name}.gguf", kind, SEED)
    header = read_header(built.path)
    assert len(header.metadata) == built.n_kv
    assert [(t.name, t.ggml_type, t.shape, t.offset - header.data_start, t.nbytes) for t in header.tensors] == [
        (e.name, e.ggml_type, e.shape, e.offset, e.nbytes) for e in built.tensors
    ]
    mapped = MappedFile(built.path)
    for info, expected in zip(header.tensors, built.tensors, strict=True):
        stored = mapped.bytes()[info.offset:info.offset + info.nbytes]
        assert torch.equal(stored, _expected_bytes(expected.offset, expected.nbytes)), info.name
        if not is_supported(info.ggml_type):
            continue
        values = GGUFTensor(info, mapped, ReadStats()).read()
        assert tuple(values.shape) == info.shape, info.name
        if info.ggml_type in FLOAT_TYPES:
            assert torch.equal(values.contiguous().view(torch.uint8).flatten(), stored), info.name


def test_every_ggml_type_is_in_the_accepted_data_file(tmp_path: Path) -> None:
    built = write_handcrafted(tmp_path / "data.gguf", Kind.DATA_SUCCESS, SEED)
    assert {t.ggml_type for t in built.tensors} == set(GGML_BLOCK_SIZES)


def test_metadata_values_read_back_and_a_non_utf8_string_is_refused_when_read(tmp_path: Path) -> None:
    """ggml keeps string bytes as they are; loader decodes them when a value is read, refusing bad UTF-8 by name."""
    built = write_handcrafted(tmp_path / "kv.gguf", Kind.KV_SUCCESS, SEED)
    metadata = read_header(built.path).metadata
    assert sorted(metadata) == sorted(key for key, _, _ in built.kv)
    refused = []
    for key, _, _ in built.kv:
        try:
            value = metadata[key]
            list(value) if not isinstance(value, str | int | float) else value
        except CheckpointFormatError as exc:
            assert f"metadata key {key!r}" in str(exc) and "not valid UTF-8" in str(exc), str(exc)
            assert str(built.path) in str(exc)
            refused.append(key)
    assert refused, "the generator writes random string bytes: some are not UTF-8"


@pytest.mark.skipif(not os.environ.get("LOADER_GGML_LIB"), reason="LOADER_GGML_LIB names no libggml-base.so")
def test_ggml_gives_the_recorded_verdicts(tmp_path: Path) -> None:
    args = []
    for kind in Kind:
        built = write_handcrafted(tmp_path / f"{kind.name}.gguf", kind, SEED)
        args.append(f"{built.path}:{int(kind.has_data)}")
    done = subprocess.run([sys.executable, "-m", "tests.helpers.ggml_verdict", os.environ["LOADER_GGML_LIB"], *args],
                          capture_output=True, text=True, check=True, timeout=60)
    verdicts = dict(line.rsplit(" ", 1) for line in done.stdout.splitlines())
    assert {Path(path).stem: verdict == "OK" for path, verdict in verdicts.items()} == {
        kind.name: kind.ggml_accepts for kind in Kind
    }
