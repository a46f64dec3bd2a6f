"""No handed-out tensor aliases a buffer that is used again.

The local reader stages row-parallel reads through one reused per-thread buffer: ``read()`` must return a
copy (this test fails if it returns the staged view). The deserializer's tensors are adopted without a copy:
they must stay intact after the stream has moved on, across batches.
"""

from __future__ import annotations

from pathlib import Path

import torch

from loader.weights import ReadStats
from loader_plugin_tensorizer.options import TensorizerOptions
from loader_plugin_tensorizer.stream import iter_tensorized, open_index


def _expected(checkpoints: dict[str, Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    folder = checkpoints["llama-float32-st"]
    return {k: v for f in folder.glob("*.safetensors") for k, v in load_file(f).items()}


def test_column_reads_are_copied_out_of_the_reused_staging_buffer(checkpoints: dict[str, Path]) -> None:
    expected = _expected(checkpoints)
    file = str(checkpoints["llama-float32-tz"] / "model.tensors")
    handles = dict(iter_tensorized([file], TensorizerOptions(), ReadStats()))
    names = ["model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
             "model.layers.1.self_attn.o_proj.weight"]
    halves = [handles[name].narrow(1, 16, 16).read() for name in names]  # row-parallel: narrow on dim 1
    for name, half in zip(names, halves, strict=True):
        assert torch.equal(half, expected[name][:, 16:32]), name


def test_row_reads_read_only_their_rows(checkpoints: dict[str, Path]) -> None:
    file = str(checkpoints["llama-float32-tz"] / "model.tensors")
    stats = ReadStats()
    handles = dict(iter_tensorized([file], TensorizerOptions(), stats))
    handle = handles["model.embed_tokens.weight"].narrow(0, 128, 128)
    values = handle.read()
    assert torch.equal(values, _expected(checkpoints)["model.embed_tokens.weight"][128:])
    assert stats.bytes_read == 128 * 64 * 4


def test_deserialized_tensors_stay_intact_after_the_stream_moves_on(checkpoints: dict[str, Path]) -> None:
    from loader_plugin_tensorizer.deserialized import iter_deserialized

    expected = _expected(checkpoints)
    key = checkpoints["key"]
    file = str(checkpoints["llama-float32-tz-enc"] / "model.tensors")
    options = TensorizerOptions(encryption_keyfile=key)
    index = open_index(file, options).without_buffers()
    held = list(iter_deserialized(file, index, options, ReadStats(), budget=20_000))  # many small batches
    assert len(held) == len(expected)
    for name, handle in held:
        assert torch.equal(handle.read(), expected[name]), name


def test_a_narrow_over_a_whole_dim_reads_straight_into_the_destination(checkpoints: dict[str, Path]) -> None:
    """A row-parallel layer at tp=1 narrows dim 1 to its whole length: no staging copy, and a file span (which
    a mapped load can map) — as the tensor itself."""
    file = str(checkpoints["llama-float32-tz"] / "model.tensors")
    handles = dict(iter_tensorized([file], TensorizerOptions(), ReadStats()))
    handle = handles["model.layers.0.self_attn.o_proj.weight"]
    whole = handle.narrow(1, 0, handle.shape[1])
    assert whole.file_span() == handle.file_span() and whole.file_span() is not None
    assert torch.equal(whole.read(), _expected(checkpoints)["model.layers.0.self_attn.o_proj.weight"])
