"""loader.io's one-pass compiled reads: widening bfloat16/float16 runs into float32 and gathering row slices,
bit for bit what torch and numpy compute, and a file that ends early named as truncated."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from loader import _fused_reads
from loader.errors import CheckpointFormatError
from loader.io import fused_reads_available, gather_rows, read_widening

pytestmark = pytest.mark.skipif(_fused_reads._library() is None, reason="no C compiler here")


def _file(tmp_path, data: bytes):
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return str(path), os.open(path, os.O_RDONLY)


@pytest.mark.parametrize("source", [torch.bfloat16, torch.float16])
def test_every_16_bit_pattern_widens_as_torch_converts_it(tmp_path, source):
    """All 65536 patterns (zeros of both signs, subnormals, infinities, NaNs with their payloads, signalling ones
    quieted as torch's conversion quiets them), at an odd offset into the file and over more than one 128 KiB
    piece."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(source)
    values = torch.cat([bits, bits.flip(0)])
    path, fd = _file(tmp_path, b"x" * 7 + values.view(torch.uint8).numpy().tobytes())
    try:
        out = torch.full((values.numel(),), 1.5)
        read_widening(fd, 7, values.numel(), source, out.data_ptr(), path=path, what="tensor 'w'")
    finally:
        os.close(fd)
    assert torch.equal(out.view(torch.int32), values.float().view(torch.int32))


@pytest.mark.parametrize(("rows", "row_stride", "segment"), [(3000, 96, 40), (5, 64, 64), (1, 8, 3), (2049, 20, 1)])
def test_row_slices_land_packed_as_a_strided_copy_puts_them(tmp_path, rows, row_stride, segment):
    """More rows than one preadv takes (512 slices and 511 gaps per call), no gap at all, one row, 1-byte slices."""
    data = np.random.default_rng(rows).integers(0, 256, 11 + rows * row_stride, dtype=np.uint8)
    path, fd = _file(tmp_path, data.tobytes())
    out = np.zeros((rows, segment), dtype=np.uint8)
    try:
        gather_rows(fd, 11, rows, row_stride, segment, out.ctypes.data, path=path, what="tensor 'w'")
    finally:
        os.close(fd)
    expected = np.lib.stride_tricks.as_strided(data[11:], (rows, segment), (row_stride, 1))
    assert np.array_equal(out, expected)


def test_a_file_that_ends_early_is_named_truncated_by_both_reads(tmp_path):
    path, fd = _file(tmp_path, bytes(1000))
    try:
        out = torch.empty(600)
        with pytest.raises(CheckpointFormatError, match=r"data.bin: tensor 'w': file ends at byte 1000, before the "
                                                        r"data the header promises \(up to byte 1200\)"):
            read_widening(fd, 0, 600, torch.bfloat16, out.data_ptr(), path=path, what="tensor 'w'")
        rows = np.empty((20, 10), dtype=np.uint8)
        with pytest.raises(CheckpointFormatError, match=r"file ends at byte 1000, before the data the header "
                                                        r"promises \(up to byte 1150\)"):
            gather_rows(fd, 0, 20, 60, 10, rows.ctypes.data, path=path, what="tensor 'w'")
    finally:
        os.close(fd)


def test_a_bad_descriptor_is_an_os_error_naming_the_file(tmp_path):
    out = torch.empty(4)
    with pytest.raises(OSError, match=r"x.bin: tensor 'w': Bad file descriptor"):
        read_widening(-1, 0, 4, torch.float16, out.data_ptr(), path="x.bin", what="tensor 'w'")


def test_the_setting_turns_them_off(monkeypatch):
    assert fused_reads_available()
    monkeypatch.setenv("LOADER_FUSED_READS", "0")
    assert not fused_reads_available()


@pytest.mark.needs_plugins
def test_without_a_compiler_they_are_unavailable_and_the_callers_bounce(monkeypatch, tmp_path):
    from safetensors.torch import save_file

    from loader_plugin_safetensors import open_checkpoint_file

    monkeypatch.setenv("CC", "no-such-compiler-here")
    monkeypatch.setenv("LOADER_CACHE_DIR", str(tmp_path))
    _fused_reads._library.cache_clear()
    try:
        assert not fused_reads_available()
        values = torch.randn(64, 40).bfloat16()
        save_file({"w": values}, str(tmp_path / "m.safetensors"))
        handle = open_checkpoint_file(tmp_path / "m.safetensors").tensor("w")
        assert torch.equal(handle.read(torch.float32), values.float())
        assert torch.equal(handle.narrow(1, 0, 20).read(), values[:, :20])
    finally:
        _fused_reads._library.cache_clear()
