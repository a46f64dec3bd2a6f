"""Fuzzing the ``.bin`` zip reader: any archive reads every tensor right, or raises a LoadError.

Two harnesses. The structured one rebuilds a ``torch.save`` archive with
Python's ``zipfile`` — each record stored or DEFLATE-compressed, storage
records cut short, padded or dropped, records added — and compares what
loader reads with ``torch.load(mmap=False)``: the same values, or both refuse
(loader with a ``LoadError`` naming the file). The byte-level one damages the
central directory, the local headers, the storage records and the pickle of
a valid archive and cuts it short, then reads every tensor in its own dtype and
as float32: that works, or a ``LoadError``. Settings: the ``loader-fuzz``
profile (tests/reliability/conftest.py).
"""

from __future__ import annotations

import io
import struct
import zipfile
from pathlib import Path

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from loader.errors import LoadError
from loader_plugin_safetensors.pickle_format import iter_pt_weights
from tests.reliability.conftest import FUZZ_PROFILE

FUZZ = settings(parent=settings.get_profile(FUZZ_PROFILE))


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    fused = torch.randn(6, 4, generator=g)
    return {"a": torch.randn(3, 5, generator=g).bfloat16(), "q": fused[:2], "k": fused[2:4],
            "t": torch.randn(4, 3, generator=g).t(), "ids": torch.arange(5), "empty": torch.zeros(0, 3),
            "scalar": torch.tensor(2.5, dtype=torch.float16)}


def _saved() -> bytes:
    buffer = io.BytesIO()
    torch.save(_state(), buffer)
    return buffer.getvalue()


_VALID = _saved()
with zipfile.ZipFile(io.BytesIO(_VALID)) as _archive:
    _RECORDS = [(info.filename, _archive.read(info.filename)) for info in _archive.infolist()]
    _LOCAL_HEADERS = [info.header_offset for info in _archive.infolist()]
_CENTRAL = struct.unpack_from("<I", _VALID, _VALID.rindex(b"PK\x05\x06") + 16)[0]
_EXPECTED = torch.load(io.BytesIO(_VALID), weights_only=True)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-bin-zip")


def _read_everything(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor read whole, and converted to float32 through ``read_into`` (the bounce path)."""
    values = {}
    for name, handle in iter_pt_weights([str(path)]):
        values[name] = handle.read()
        assert tuple(values[name].shape) == handle.shape
        if handle.dtype.is_floating_point:
            converted = torch.empty(handle.shape, dtype=torch.float32)
            handle.read_into(converted)
            assert torch.equal(converted, values[name].float())
    return values


_EDITS = st.dictionaries(st.integers(0, len(_RECORDS) - 1),
                         st.sampled_from(["deflate", "deflate", "cut", "pad", "drop", "empty"]), max_size=2)
"""At most two records changed, so that many rebuilt archives are valid and their values are compared."""


@FUZZ
@given(_EDITS, st.booleans(), st.integers(1, 8), st.sampled_from([None, None, "data/99", "data.pkl", "extra"]))
def test_rebuilt_archives_read_like_torch_load_or_are_refused(
    scratch: Path, edits: dict[int, str], deflate_all: bool, cut: int, added: str | None
) -> None:
    path = scratch / "rebuilt.bin"
    with zipfile.ZipFile(path, "w") as archive:
        for index, (name, data) in enumerate(_RECORDS):
            edit = edits.get(index, "keep")
            method = zipfile.ZIP_DEFLATED if deflate_all or edit == "deflate" else zipfile.ZIP_STORED
            if edit == "drop":
                continue
            data = {"cut": data[:-cut], "pad": data + b"\0" * cut, "empty": b""}.get(edit, data)
            archive.writestr(zipfile.ZipInfo(name), data, compress_type=method)
        if added is not None:
            archive.writestr(f"{_RECORDS[0][0].split('/')[0]}/{added}", b"\x80\x02N.")
    with zipfile.ZipFile(path) as archive:
        names = [info.filename for info in archive.infolist()]
    try:
        reference = torch.load(path, weights_only=True, mmap=False)
    except Exception:  # any refusal by the reference: loader must refuse too
        reference = None
    try:
        got = _read_everything(path)
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(path) in str(exc)
        if len(set(names)) < len(names):  # torch picks one of two same-named records; loader refuses
            assert "appears twice" in str(exc)
            return
        assert reference is None or not all(torch.equal(reference[n], _EXPECTED[n]) for n in _EXPECTED), (
            f"torch.load reads this archive, loader refused it: {exc}"
        )
        return
    event("read")
    assert reference is not None, "loader read an archive torch.load refuses"
    assert set(got) == set(reference)
    for name, values in reference.items():
        assert got[name].dtype == values.dtype and torch.equal(got[name], values), name


_STRUCTURE = (st.integers(_CENTRAL, len(_VALID) - 1)  # the central directory and its end record
              | st.sampled_from(_LOCAL_HEADERS).flatmap(lambda at: st.integers(at, at + 40))  # local headers
              | st.integers(0, len(_VALID) - 1))  # anywhere: storage records, the pickle
_FIELDS = st.binary(min_size=1, max_size=4) | st.sampled_from([struct.pack("<I", 0xFFFFFFFF), struct.pack("<H", 8),
                                                              struct.pack("<I", 1 << 31), b"\0\0\0\0"])


@FUZZ
@given(st.lists(st.tuples(_STRUCTURE, _FIELDS), max_size=4), st.integers(0, len(_VALID)))
def test_damaged_archives_read_every_tensor_or_raise_load_error(
    scratch: Path, edits: list[tuple[int, bytes]], keep: int
) -> None:
    blob = bytearray(_VALID)
    for at, raw in edits:
        blob[at:at + len(raw)] = raw
    path = scratch / "damaged.bin"
    path.write_bytes(bytes(blob[:keep]) if keep < len(_VALID) // 2 else bytes(blob))
    try:
        _read_everything(path)
        event("read")
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        assert str(path) in str(exc)
