"""A source with no local folder: an in-process plugin serves a checkpoint from a dict of bytes.

The plugin only resolves ``memory://`` locations, lists its files and hands out
bytes; the core reads ``config.json``, the tokenizer and the index through the
source's reader and applies the index and training-artifact filtering, exactly
as for a local folder. The checkpoint is sharded with an index, written by
``transformers``; the logits equal those of the same folder loaded from disk.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pytest
import torch

import loader
from loader import _hooks as hooks
from loader._options import LoadOptions
from loader._plugins import PluginHost, create_plugin_host
from loader._sharded.writer import write_safetensors
from loader.checkpoint import Source, WeightFormat
from loader.errors import CheckpointFormatError, ConfigError, SourceNotFoundError
from loader.weights import CheckpointTensor, EagerTensor, ReadStats
from tests.helpers.hf_checkpoints import save_checkpoint
from tests.helpers.tokenizers_files import write_tokenizer

FORMAT = "memory-safetensors"
OPTIONS = LoadOptions(dtype=torch.float32, device=torch.device("cpu"))


class DictReader:
    """A :class:`~loader.checkpoint.SourceReader` over a dict of relative name -> bytes."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self.files = dict(files)
        self.reads: list[str] = []

    def list_files(self) -> Sequence[str]:
        return sorted(self.files)

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        self.reads.append(name)
        data = self.files.get(name)
        return None if data is None else data[: limit + 1]


class DictSource:
    """Resolves ``memory://NAME`` to one of its stores, detects its safetensors files, streams them."""

    def __init__(self, stores: Mapping[str, Mapping[str, bytes]]) -> None:
        self.readers = {name: DictReader(files) for name, files in stores.items()}

    @loader.hookimpl
    def loader_resolve_source(self, location: str) -> Source | None:
        name = location.removeprefix("memory://")
        if not location.startswith("memory://") or name not in self.readers:
            return None
        return Source(location=location, path=None, uri=location, reader=self.readers[name])

    @loader.hookimpl
    def loader_detect_format(self, source: Source, requested: str) -> WeightFormat | None:
        if not isinstance(source.reader, DictReader) or requested not in ("auto", FORMAT):
            return None
        names = source.reader.list_files()
        files = tuple(source.file_uri(n) for n in names if n.endswith(".safetensors"))
        index = "model.safetensors.index.json"
        return WeightFormat(FORMAT, files, index=source.file_uri(index) if index in names else None)

    @loader.hookimpl
    def loader_iter_weights(self, source: Source, weight_format: WeightFormat, stats: ReadStats
                            ) -> Iterator[tuple[str, CheckpointTensor]] | None:
        if weight_format.name != FORMAT or not isinstance(source.reader, DictReader):
            return None
        return self._stream(source, source.reader, weight_format.files, stats)

    @staticmethod
    def _stream(source: Source, reader: DictReader, files: Sequence[str], stats: ReadStats
                ) -> Iterator[tuple[str, CheckpointTensor]]:
        from safetensors.torch import load

        for file in files:
            name = source.relative_name(file)
            assert name is not None
            data = reader.files[name]
            stats.add(len(data))
            for tensor_name, tensor in load(data).items():
                yield tensor_name, EagerTensor(tensor, tensor_name, file)


def _folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _host(stores: Mapping[str, Mapping[str, bytes]]) -> PluginHost:
    host = create_plugin_host()  # the installed model plugins, on a fresh manager
    host.register(DictSource(stores), "dict-source")
    return host


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama-sharded")
    save_checkpoint("llama", path, max_shard_size="40KB")
    write_tokenizer(path)
    return path


def test_sharded_checkpoint_from_bytes_loads_like_the_folder(folder: Path) -> None:
    files = _folder_bytes(folder)
    shards = json.loads(files["model.safetensors.index.json"])["weight_map"].values()
    assert len(set(shards)) > 1  # really sharded
    stray = {"stray.safetensors": files[next(iter(shards))],  # not in the index: its tensors would repeat
             "optimizer.safetensors": b"not weights", "original/consolidated.safetensors": b"not weights"}
    host = _host({"llama": {**files, **stray}})
    ids = torch.tensor([[1, 5, 9, 200, 3]])
    local = loader.load_model(str(folder), dtype="float32")
    remote, report = loader.load_model_with_report("memory://llama", dtype="float32", host=host)
    assert torch.equal(remote(ids), local(ids))
    assert report.load_format == FORMAT
    assert sorted(report.files) == sorted(f"memory://llama/{s}" for s in set(shards))
    reader = host.get_plugin("dict-source").readers["llama"]
    assert {"config.json", "model.safetensors.index.json"} <= set(reader.reads)


def test_tokenizer_is_read_from_bytes(folder: Path) -> None:
    host = _host({"llama": _folder_bytes(folder)})
    source = hooks.resolve_source("memory://llama", OPTIONS, host)
    weight_format = hooks.detect_format(source, "auto", host)
    remote = hooks.load_tokenizer(source, weight_format, host)
    local = hooks.load_tokenizer(Source(str(folder), folder), weight_format, host)
    text = "hello loader"
    assert remote.tokenizer.encode(text).ids == local.tokenizer.encode(text).ids
    assert remote.eos_token_ids == local.eos_token_ids


def _store(tmp_path: Path, index: object) -> dict[str, bytes]:
    write_safetensors(tmp_path / "a.safetensors", [("w", torch.zeros(2))])
    return {"config.json": json.dumps({"architectures": ["LlamaForCausalLM"]}).encode(),
            "a.safetensors": (tmp_path / "a.safetensors").read_bytes(),
            "model.safetensors.index.json": json.dumps(index).encode()}


@pytest.mark.parametrize(("index", "error", "message"), [
    ({"weight_map": {"w": "a.safetensors", "v": "b.safetensors"}}, SourceNotFoundError,
     r"^memory://bad/model.safetensors.index.json: the index names shard\(s\) the memory-safetensors format "
     "did not list: b.safetensors$"),
    ({"weight_map": {"w": "../a.safetensors"}}, CheckpointFormatError,
     r"weight_map\['w'\] = '../a.safetensors' points outside the model folder"),
    ({"weight_map": {}}, CheckpointFormatError, "'weight_map' must be a non-empty object"),
    ({"weight_map": {"w": 3}}, CheckpointFormatError, r"weight_map\['w'\] must be a file name, found 3"),
    ([1], ConfigError, "weight index must be a JSON object, found list"),
])
def test_a_bad_remote_index_is_named(tmp_path: Path, index: object, error: type[Exception], message: str) -> None:
    host = _host({"bad": _store(tmp_path, index)})
    with pytest.raises(error, match=message):
        loader.load_model("memory://bad", host=host)


def test_an_oversized_remote_config_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import loader.checkpoint

    monkeypatch.setattr(loader.checkpoint, "MAX_JSON_BYTES", 10)
    store = _store(tmp_path, {"weight_map": {"w": "a.safetensors"}})
    host = _host({"big": store})
    source = hooks.resolve_source("memory://big", OPTIONS, host)
    with pytest.raises(ConfigError, match=r"^memory://big/config.json: more than the 10 bytes allowed"):
        loader.checkpoint.read_source_file(source, "config.json", loader.checkpoint.MAX_JSON_BYTES)
