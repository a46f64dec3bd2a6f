"""``loader_iter_weights`` for safetensors: every tensor, lazily, files held only while walked."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from loader import _hooks as hooks
from loader._options import LoadOptions
from loader._plugins import create_plugin_host
from loader.checkpoint import Source
from loader.errors import CheckpointFormatError
from loader.weights import ReadStats
from loader_plugin_safetensors.stream import iter_safetensors_weights


def _options() -> LoadOptions:
    return LoadOptions(dtype=torch.float32, device=torch.device("cpu"))


@pytest.fixture
def sharded(tmp_path):
    g = torch.Generator().manual_seed(2)
    first = {"model.embed_tokens.weight": torch.randn(16, 8, generator=g).bfloat16(),
             "model.layers.0.mlp.up_proj.weight": torch.randn(12, 8, generator=g)}
    second = {"model.norm.weight": torch.randn(8, generator=g).half(),
              "lm_head.weight": torch.randn(16, 8, generator=g)}
    save_file(first, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(second, str(tmp_path / "model-00002-of-00002.safetensors"))
    return tmp_path, {**first, **second}


def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_core_iter_weights_yields_every_tensor_unread(sharded):
    folder, expected = sharded
    host = create_plugin_host(environ={"LOADER_PLUGINS": "safetensors"})
    source = Source(location=str(folder), path=folder)
    weight_format = hooks.detect_format(source, "auto", host=host)
    stats = ReadStats()
    stream = hooks.iter_weights(source, weight_format, _options(), stats, host=host)
    handles = dict(stream)
    assert set(handles) == set(expected)
    assert stats.bytes_read == 0  # yielding reads nothing
    for name, handle in handles.items():
        assert torch.equal(handle.read(), expected[name]), name
    on_disk = {}
    for path in weight_format.files:
        on_disk.update(load_file(path))
    assert stats.bytes_read == sum(t.numel() * t.element_size() for t in on_disk.values())


def test_file_is_held_while_walked_and_released_after(sharded):
    folder, _ = sharded
    files = sorted(str(p) for p in folder.glob("*.safetensors"))
    before = _fd_count()
    stream = iter_safetensors_weights(files)
    _, first = next(stream)
    assert first.descriptor.is_open and _fd_count() == before + 1
    _, second = next(stream)
    _, third = next(stream)  # moved on to the second file
    assert not first.descriptor.is_open and third.descriptor.is_open
    assert torch.equal(second.read(), second.read())  # a late read reopens and closes again
    assert not first.descriptor.is_open and _fd_count() == before + 1
    stream.close()  # abandoned mid-file: the generator's finally releases it
    assert not third.descriptor.is_open and _fd_count() == before


def test_same_name_in_two_files_names_both(tmp_path):
    save_file({"a": torch.zeros(2), "shared": torch.zeros(3)}, str(tmp_path / "one.safetensors"))
    save_file({"shared": torch.ones(3)}, str(tmp_path / "two.safetensors"))
    stream = iter_safetensors_weights([str(tmp_path / "one.safetensors"), str(tmp_path / "two.safetensors")])
    assert sorted(next(stream)[0] for _ in range(2)) == ["a", "shared"]
    with pytest.raises(CheckpointFormatError) as info:
        next(stream)
    message = str(info.value)
    assert "tensor 'shared' appears in two files" in message
    assert str(tmp_path / "one.safetensors") in message and str(tmp_path / "two.safetensors") in message


def test_tensors_come_in_file_order(tmp_path):
    tensors = {name: torch.full((4,), float(i)) for i, name in enumerate(["z", "a", "m"])}
    save_file(tensors, str(tmp_path / "x.safetensors"))
    handles = list(iter_safetensors_weights([str(tmp_path / "x.safetensors")]))
    begins = [h.info.begin for _, h in handles]
    assert begins == sorted(begins) and {n for n, _ in handles} == set(tensors)


def test_iter_weights_ignores_other_formats_and_remote_sources(sharded):
    from loader.checkpoint import WeightFormat
    from loader_plugin_safetensors import plugin

    folder, _ = sharded
    source = Source(location=str(folder), path=folder)
    assert plugin.loader_iter_weights(source, WeightFormat("gguf", ()), _options(), ReadStats()) is None
    remote = Source(location="s3://bucket/model", path=None, uri="s3://bucket/model")
    st_format = WeightFormat("safetensors", ("s3://bucket/model/model.safetensors",))
    assert plugin.loader_iter_weights(remote, st_format, _options(), ReadStats()) is None
