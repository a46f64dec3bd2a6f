"""Reads land in their destination: the parameter itself when it can, else through the bounded staging ring.

The stream's handles are read by the streamer's request API straight into the
memory they are read into; only the bytes of the narrowed shard are fetched; a
conversion goes through a ring no larger than ``memory_limit``; writes into the
model's own memory are waited for once, at the end of the stream, and not one by one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import loader
from loader.weights import ReadStats
from loader_plugin_runai import tensor as tensor_module
from loader_plugin_runai.settings import StreamerSettings
from loader_plugin_runai.staging import StagingRing
from loader_plugin_runai.stream import iter_streamed_weights
from loader_plugin_runai.tensor import StreamedTensor


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.safetensors"))


def _truth(folder: Path) -> dict[str, torch.Tensor]:
    values: dict[str, torch.Tensor] = {}
    for file in _files(folder):
        values.update(load_file(file))
    return values


def test_handles_read_in_place_later_and_twice_are_bit_equal(llama_checkpoint: Path) -> None:
    truth = _truth(llama_checkpoint)
    stats = ReadStats()
    kept = list(iter_streamed_weights(_files(llama_checkpoint), StreamerSettings(), stats, where="test"))
    assert sorted(name for name, _ in kept) == sorted(truth)
    assert stats.bytes_read == 0  # yielding a handle fetches nothing
    for name, handle in kept:  # read after the stream ended: a handle fetches its bytes when read
        out = torch.empty(handle.shape, dtype=handle.dtype)
        handle.read_into(out)
        assert torch.equal(out, truth[name]) and torch.equal(handle.read(), truth[name]), name
    assert stats.bytes_read == 2 * sum(t.numel() * t.element_size() for t in truth.values())


@pytest.mark.parametrize("dim", [0, 1])
def test_a_narrowed_handle_fetches_only_its_bytes(llama_checkpoint: Path, dim: int) -> None:
    truth = _truth(llama_checkpoint)
    stats = ReadStats()
    expected = 0
    for name, handle in iter_streamed_weights(_files(llama_checkpoint), StreamerSettings(), stats, where="test"):
        if handle.ndim != 2:
            continue
        half = handle.shape[dim] // 2
        out = torch.empty_like(truth[name].narrow(dim, half, handle.shape[dim] - half))
        handle.narrow(dim, half, out.shape[dim]).read_into(out)
        assert torch.equal(out, truth[name].narrow(dim, half, out.shape[dim])), name
        expected += out.numel() * out.element_size()
    assert stats.bytes_read == expected


def test_a_converting_read_stays_within_the_ring(tmp_path: Path) -> None:
    """A tensor three times the ring, read whole and narrowed on an inner dim, converted piece by piece."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    truth = {"big": torch.randn(768, 1024), "small": torch.randn(3, 5)}  # 3 MiB of float32, and a small one
    save_file(truth, tmp_path / "m.safetensors")
    limit = 1 << 20
    stream = iter_streamed_weights([str(tmp_path / "m.safetensors")], StreamerSettings(memory_limit=limit),
                                   ReadStats(), where="test")
    rings: list[StagingRing] = []
    for name, handle in stream:
        assert isinstance(handle, StreamedTensor)
        rings.append(handle.source.reads.ring)
        out = torch.empty(handle.shape, dtype=torch.bfloat16)
        handle.read_into(out)
        assert torch.equal(out, truth[name].to(torch.bfloat16)), name
        cols = handle.shape[1] // 3
        part = torch.empty((handle.shape[0], cols), dtype=torch.float64)
        handle.narrow(1, cols, cols).read_into(part)
        assert torch.equal(part, truth[name][:, cols:2 * cols].double()), name
        assert rings[-1].allocated_bytes <= limit
    assert rings[0] is rings[-1] and rings[0].allocated_bytes == limit  # one ring, reused, at its bound


def test_the_default_ring_is_the_largest_tensor() -> None:
    assert StreamerSettings().ring_bytes([5 << 20, 3 << 20]) == 5 << 20
    assert StreamerSettings(memory_limit=-1).ring_bytes([5 << 20]) == 5 << 20
    assert StreamerSettings(memory_limit=0).ring_bytes([10]) == 1 << 20  # never below the minimum
    assert StreamerSettings(memory_limit=3 << 20).ring_bytes([5 << 20]) == 3 << 20


def test_a_load_in_the_stored_dtype_writes_every_byte_in_place(llama_checkpoint: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No staging and no read into fresh memory: fused parts (k, v after q; up after gate) included."""
    def refuse(*_: Any, **__: Any) -> Any:
        raise AssertionError("a load in the stored dtype went through a copy")

    monkeypatch.setenv("LOADER_MAP_MIN_BYTES", "4096")  # the tiny model's tensors get regions, as a real one's do
    monkeypatch.setattr(StagingRing, "take", refuse)
    monkeypatch.setattr(tensor_module.StreamedTensor, "read", refuse)
    streamed = loader.load_model(str(llama_checkpoint), dtype="float32", load_format="runai_streamer")
    mapped = loader.load_model(str(llama_checkpoint), dtype="float32")
    for (name, x), (_, y) in zip(streamed.state_dict().items(), mapped.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_a_converting_load_is_bit_equal_to_the_mapped_load(llama_checkpoint: Path) -> None:
    streamed = loader.load_model(str(llama_checkpoint), dtype="bfloat16", load_format="runai_streamer",
                                 format_options={"memory_limit": "1MiB"})
    mapped = loader.load_model(str(llama_checkpoint), dtype="bfloat16")
    for (name, x), (_, y) in zip(streamed.state_dict().items(), mapped.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
