"""Tensors are copied out of the streamer's buffers before the streamer reuses them.

The first test shows the hazard is real in this configuration: views the
streamer yields with ``owned=False`` and that a consumer keeps are overwritten
by later tensors. The others hold the plugin's stream to the rule that
prevents it: a handle kept unread is copied out when the stream advances, a
handle already read is dropped (no second copy), and reading it again raises
instead of returning whatever the buffer holds by then.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from loader.weights import ReadStats
from loader_plugin_runai.settings import StreamerSettings
from loader_plugin_runai.stream import iter_streamed_weights
from loader_plugin_runai.tensor import StreamedTensor

SMALL_RING = StreamerSettings(memory_limit=0)
"""``0``: the streamer's ring holds one largest tensor, so it reuses its buffers at once."""


def _files(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.glob("*.safetensors"))


def _truth(folder: Path) -> dict[str, torch.Tensor]:
    values: dict[str, torch.Tensor] = {}
    for file in _files(folder):
        values.update(load_file(file))
    return values


def test_the_streamer_reuses_the_buffers_of_views_a_consumer_keeps(llama_checkpoint: Path) -> None:
    from runai_model_streamer import SafetensorsStreamer

    truth = _truth(llama_checkpoint)
    with SMALL_RING.applied(), SafetensorsStreamer() as streamer:
        streamer.stream_files(_files(llama_checkpoint), device="cpu", owned=False)
        kept = list(streamer.get_tensors())
        corrupted = [name for name, view in kept if not torch.equal(view, truth[name])]
    assert len(kept) == len(truth)
    assert corrupted, "the streamer no longer reuses its buffers here; this file's other tests prove nothing"


def test_handles_kept_unread_across_steps_hold_their_own_values(llama_checkpoint: Path) -> None:
    truth = _truth(llama_checkpoint)
    stats = ReadStats()
    kept = list(iter_streamed_weights(_files(llama_checkpoint), SMALL_RING, stats, where="test"))
    assert sorted(name for name, _ in kept) == sorted(truth)
    for name, handle in kept:
        assert isinstance(handle, StreamedTensor) and handle.slot.owned, name
        assert torch.equal(handle.read(), truth[name]), name
    assert stats.bytes_read == sum(t.numel() * t.element_size() for t in truth.values())
    assert stats.tensors_read == len(truth)


def test_a_handle_read_at_once_is_not_copied_twice(llama_checkpoint: Path) -> None:
    truth = _truth(llama_checkpoint)
    seen = 0
    for name, handle in iter_streamed_weights(_files(llama_checkpoint), SMALL_RING, ReadStats(), where="test"):
        rows = handle.shape[0] // 2 or 1
        out = torch.empty((rows, *handle.shape[1:]), dtype=torch.float64)
        handle.narrow(0, 0, rows).read_into(out)
        assert torch.equal(out, truth[name][:rows].double()), name
        assert not handle.slot.owned
        seen += 1
    assert seen == len(truth)


def test_reading_again_after_the_stream_moved_on_raises(llama_checkpoint: Path) -> None:
    stream = iter_streamed_weights(_files(llama_checkpoint), SMALL_RING, ReadStats(), where="test")
    name, first = next(stream)
    first.read()
    next(stream)
    with pytest.raises(RuntimeError, match=rf"tensor '{name}' in .* was read again after the Run:ai stream moved"):
        first.read()
    stream.close()


def test_a_narrowed_handle_kept_unread_reads_its_rows(llama_checkpoint: Path) -> None:
    truth = _truth(llama_checkpoint)
    stream = iter_streamed_weights(_files(llama_checkpoint), SMALL_RING, ReadStats(), where="test")
    kept = [(name, handle.narrow(0, 1, 1)) for name, handle in stream if handle.ndim == 2]
    for name, handle in kept:
        assert torch.equal(handle.read(), truth[name][1:2]), name
