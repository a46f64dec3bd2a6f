"""``.bin`` zip archives read record by record: compressed entries, short storage records, values as torch.load."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
import torch

from loader.errors import CheckpointFormatError
from loader.weights import ReadStats
from loader_plugin_safetensors.pickle_format import iter_pt_weights
from tests.helpers.pickle_zips import data_record_names, repack_zip


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    fused = torch.randn(12, 8, generator=g)
    return {"model.embed_tokens.weight": torch.randn(10, 6, generator=g).bfloat16(),
            "model.norm.weight": torch.randn(6, generator=g),
            "q": fused[:4], "k": fused[4:8],  # views sharing one storage, at an offset
            "t": torch.randn(5, 3, generator=g).t(),  # not row-major
            "ids": torch.arange(7, dtype=torch.int64)}


def _read_all(path: Path) -> dict[str, torch.Tensor]:
    return {name: handle.read() for name, handle in iter_pt_weights([str(path)], ReadStats())}


def _assert_same_as_torch_load(path: Path) -> None:
    expected = torch.load(path, weights_only=True, mmap=False)
    got = _read_all(path)
    assert set(got) == set(expected)
    for name, values in expected.items():
        assert got[name].dtype == values.dtype and torch.equal(got[name], values), name


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED])
def test_repacked_bin_reads_what_torch_load_reads(tmp_path: Path, compression: int) -> None:
    """Issue 16 item 5: a DEFLATE-compressed archive used to load its compressed bytes as weights."""
    original = tmp_path / "saved.bin"
    torch.save(_state(), original)
    repacked = repack_zip(original, tmp_path / "pytorch_model.bin", compression=compression)
    _assert_same_as_torch_load(original)
    _assert_same_as_torch_load(repacked)


def test_deflated_bin_narrowed_and_converted(tmp_path: Path) -> None:
    original = tmp_path / "saved.bin"
    state = _state()
    torch.save(state, original)
    repacked = repack_zip(original, tmp_path / "pytorch_model.bin", compression=zipfile.ZIP_DEFLATED)
    handles = dict(iter_pt_weights([str(repacked)]))
    out = torch.empty(3, 3, dtype=torch.float32)
    handles["model.embed_tokens.weight"].narrow(0, 2, 3).narrow(1, 1, 3).read_into(out)
    assert torch.equal(out, state["model.embed_tokens.weight"][2:5, 1:4].float())


def test_storage_record_shorter_than_its_tensor_is_refused(tmp_path: Path) -> None:
    """Issue 16 item 6: a short record used to read into the next entries (torch.load(mmap=True) does too)."""
    original = tmp_path / "saved.bin"
    torch.save({"a": torch.arange(6, dtype=torch.float32), "b": torch.ones(4)}, original)
    first = data_record_names(original)[0]
    path = repack_zip(original, tmp_path / "pytorch_model.bin",
                      edit=lambda name, data: data[:8] if name == first else data)
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(path, weights_only=True, mmap=False)  # the reference refuses it too
    with pytest.raises(CheckpointFormatError) as info:
        _read_all(path)
    message = str(info.value)
    assert str(path) in message and f"'{first}'" in message
    assert "holds 8 bytes" in message and "needs 24" in message


def test_storage_record_longer_than_its_tensor_is_refused(tmp_path: Path) -> None:
    original = tmp_path / "saved.bin"
    torch.save({"a": torch.arange(6, dtype=torch.float32)}, original)
    path = repack_zip(original, tmp_path / "pytorch_model.bin",
                      edit=lambda name, data: data + b"\0" * 4 if "/data/" in name else data)
    with pytest.raises(RuntimeError, match="record size"):
        torch.load(path, weights_only=True, mmap=False)
    with pytest.raises(CheckpointFormatError, match="28 bytes"):
        _read_all(path)


def test_big_endian_archive_is_byte_swapped_as_torch_does(tmp_path: Path) -> None:
    original = tmp_path / "saved.bin"
    torch.save({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "i": torch.arange(3)}, original)
    itemsizes = {n: 8 if "/data/1" in n else 4 for n in data_record_names(original)}

    def to_big(name: str, data: bytes) -> bytes:
        if name.endswith("/byteorder"):
            return b"big"
        if name in itemsizes:
            size = itemsizes[name]
            return b"".join(data[i:i + size][::-1] for i in range(0, len(data), size))
        return data

    path = repack_zip(original, tmp_path / "pytorch_model.bin", edit=to_big)
    _assert_same_as_torch_load(path)
