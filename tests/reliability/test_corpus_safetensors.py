"""Malformed safetensors checkpoints through ``loader.load_model``: each refused, naming file and tensor.

Every case starts from a valid two-shard tiny Llama and breaks one thing in
its bytes, its header, its index or its folder layout.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import pytest
import safetensors.torch as safetensors_torch
import torch

import loader
from loader.errors import (
    CheckpointFormatError,
    ConfigError,
    MissingWeightsError,
    ShapeMismatchError,
    SourceNotFoundError,
    UnexpectedWeightError,
)
from tests.helpers.malformed import (
    INDEX_NAME,
    data_start,
    edit_header,
    read_raw_safetensors,
    shard_holding,
    write_llama_checkpoint,
    write_raw_safetensors,
    write_safetensors,
)
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

LAST = "model.norm.weight"  # the second shard's last tensor but one (lm_head follows)
K0, V0 = "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight"
EMBED = "model.embed_tokens.weight"


def _model(folder: Path) -> Path:
    model = folder / "model"
    write_llama_checkpoint(model)
    return model


def _second_shard(model: Path) -> Path:
    return model / "model-00002-of-00002.safetensors"


def _truncated_mid_tensor(folder: Path) -> Built:
    model = _model(folder)
    shard = _second_shard(model)
    header, _ = read_raw_safetensors(shard)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    begin, end = header[last]["data_offsets"]
    with shard.open("r+b") as fh:
        fh.truncate(data_start(shard) + (begin + end) // 2)
    return Built(model, (str(shard), f"tensor {last!r}", "run past the end of the data"))


def _header_length_beyond_file(folder: Path) -> Built:
    model = _model(folder)
    shard = _second_shard(model)
    blob = bytearray(shard.read_bytes())
    blob[:8] = struct.pack("<Q", len(blob) + 10)
    shard.write_bytes(bytes(blob))
    return Built(model, (str(shard), f"header length {len(blob) + 10} runs past the end of the file"))


def _raw_header(raw: bytes, *fragments: str):  # type: ignore[no-untyped-def]
    def build(folder: Path) -> Built:
        model = _model(folder)
        shard = _second_shard(model)
        _, data = read_raw_safetensors(shard)
        write_raw_safetensors(shard, raw_header=raw, data=data)
        return Built(model, (str(shard), *fragments))

    return build


def _huge_header_length(folder: Path) -> Built:
    model = _model(folder)
    shard = _second_shard(model)
    write_raw_safetensors(shard, {}, declared_length=(1 << 64) - 1)
    return Built(model, (str(shard), f"header length {(1 << 64) - 1} is more than the 100000000 bytes allowed"))


def _edited(change, *fragments: str, shard_of: str = LAST):  # type: ignore[no-untyped-def]
    """A case editing the header of the shard holding ``shard_of``; fragments may use {shard}."""

    def build(folder: Path) -> Built:
        model = _model(folder)
        shard = shard_holding(model, shard_of)
        edit_header(shard, change)
        return Built(model, (str(shard), *fragments))

    return build


def _overlap(header: dict) -> None:  # type: ignore[type-arg]
    header[V0]["data_offsets"] = list(header[K0]["data_offsets"])


def _reversed_offsets(header: dict) -> None:  # type: ignore[type-arg]
    begin, end = header[LAST]["data_offsets"]
    header[LAST]["data_offsets"] = [end, begin]


def _past_the_end(header: dict) -> None:  # type: ignore[type-arg]
    end = max(e["data_offsets"][1] for k, e in header.items() if k != "__metadata__")
    span = header[LAST]["data_offsets"][1] - header[LAST]["data_offsets"][0]
    header[LAST]["data_offsets"] = [end + 4, end + 4 + span]


def _gap_before_last(folder: Path) -> Built:
    """16 unused bytes before ``LAST``'s data, every later offset shifted: a gap the reference reader refuses."""
    model = _model(folder)
    shard = shard_holding(model, LAST)
    header, data = read_raw_safetensors(shard)
    at = header[LAST]["data_offsets"][0]
    for name, entry in header.items():
        if name != "__metadata__" and entry["data_offsets"][0] >= at:
            entry["data_offsets"] = [entry["data_offsets"][0] + 16, entry["data_offsets"][1] + 16]
    write_raw_safetensors(shard, header, data[:at] + bytes(16) + data[at:])
    return Built(model, (str(shard), f"tensor {LAST!r}", f"starts at {at + 16}", f"ends at {at}", "gap"))


def _trailing_bytes(folder: Path) -> Built:
    model = _model(folder)
    shard = _second_shard(model)
    size = len(read_raw_safetensors(shard)[1])
    with shard.open("ab") as fh:
        fh.write(bytes(16))
    return Built(model, (str(shard), f"cover {size} of the {size + 16} bytes", "fully covered"))


def _empty_inside(header: dict) -> None:  # type: ignore[type-arg]
    begin = header[K0]["data_offsets"][0]
    header["model.empty"] = {"dtype": "F32", "shape": [0], "data_offsets": [begin + 4, begin + 4]}


def _set(name: str, key: str, value: object):  # type: ignore[no-untyped-def]
    def change(header: dict) -> None:  # type: ignore[type-arg]
        header[name][key] = value

    return change


def _drop(name: str, key: str):  # type: ignore[no-untyped-def]
    def change(header: dict) -> None:  # type: ignore[type-arg]
        del header[name][key]

    return change


def _duplicate_across_shards(folder: Path) -> Built:
    model = _model(folder)
    first, second = shard_holding(model, EMBED), _second_shard(model)
    header, data = read_raw_safetensors(first)
    begin, end = header[EMBED]["data_offsets"]
    embed = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32).reshape(header[EMBED]["shape"])
    tensors = _read_all(second)
    tensors[EMBED] = embed
    write_safetensors(second, tensors)
    return Built(model, (f"tensor {EMBED!r}", str(first), str(second), "two files"))


def _read_all(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return dict(load_file(str(path)))


def _index_pointing(target: str | None, *fragments: str, symlink: bool = False):  # type: ignore[no-untyped-def]
    """Point the index entry of ``LAST`` at ``target`` (``None``: an absolute path to the outside file)."""

    def build(folder: Path) -> Built:
        model = _model(folder)
        outside = folder / "outside.safetensors"
        shard = _second_shard(model)
        shutil.copy(shard, outside)
        if symlink:
            shard.unlink()
            shard.symlink_to(outside)
            return Built(model, (str(model / INDEX_NAME), repr(shard.name), "outside the model folder"),
                         outside=outside)
        index = json.loads((model / INDEX_NAME).read_text())
        entry = str(outside) if target is None else target
        index["weight_map"][LAST] = entry
        (model / INDEX_NAME).write_text(json.dumps(index))
        return Built(model, (str(model / INDEX_NAME), repr(entry), *fragments), outside=outside)

    return build


def _index_names_missing_shard(folder: Path) -> Built:
    model = _model(folder)
    index = json.loads((model / INDEX_NAME).read_text())
    index["weight_map"][LAST] = "model-00003-of-00002.safetensors"
    (model / INDEX_NAME).write_text(json.dumps(index))
    return Built(model, (str(model / INDEX_NAME), "model-00003-of-00002.safetensors", "do not exist"))


def _index_text(text: str, *fragments: str):  # type: ignore[no-untyped-def]
    def build(folder: Path) -> Built:
        model = _model(folder)
        (model / INDEX_NAME).write_text(text)
        return Built(model, (str(model / INDEX_NAME), *fragments))

    return build


def _file_bytes(blob: bytes, *fragments: str):  # type: ignore[no-untyped-def]
    def build(folder: Path) -> Built:
        model = _model(folder)
        shard = _second_shard(model)
        shard.write_bytes(blob)
        return Built(model, (str(shard), *fragments))

    return build


def _tensor_swap(name: str, value: torch.Tensor | None, *fragments: str):  # type: ignore[no-untyped-def]
    """Replace (or, with ``None``, remove) one tensor, keeping the index in step."""

    def build(folder: Path) -> Built:
        model = _model(folder)
        shard = shard_holding(model, LAST)
        tensors = _read_all(shard)
        if value is None:
            del tensors[name]
        else:
            tensors[name] = value
        write_safetensors(shard, tensors)
        index = json.loads((model / INDEX_NAME).read_text())
        index["weight_map"] = {n: f for n, f in index["weight_map"].items() if n in tensors or f != shard.name}
        index["weight_map"].update(dict.fromkeys(tensors, shard.name))
        (model / INDEX_NAME).write_text(json.dumps(index))
        return Built(model, fragments)

    return build


def _shard_is_a_fifo(folder: Path) -> Built:
    """A named pipe where the weights should be: opening it to read would block forever."""
    model = folder / "model"
    write_llama_checkpoint(model, shards=1)
    shard = model / "model.safetensors"
    shard.unlink()
    os.mkfifo(shard)
    return Built(model, (str(model), "no weight files"))


DEEP = "[" * 100_000 + "]" * 100_000

CASES = [
    CorpusCase("truncated-mid-tensor", _truncated_mid_tensor, CheckpointFormatError),
    CorpusCase("header-length-beyond-file", _header_length_beyond_file, CheckpointFormatError),
    CorpusCase("header-not-json", _raw_header(b"{this is not json", "header is not valid JSON"),
               CheckpointFormatError),
    CorpusCase("header-not-utf8", _raw_header(b'{"\xff\xfe": 1}', "header is not UTF-8"), CheckpointFormatError),
    CorpusCase("header-not-an-object", _raw_header(b"[1, 2, 3]", "must be a JSON object of tensors"),
               CheckpointFormatError),
    CorpusCase("header-nested-too-deep", _raw_header(DEEP.encode(), "header is not valid JSON"),
               CheckpointFormatError),
    CorpusCase("header-duplicate-tensor", _raw_header(
        b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, '
        b'"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}', "tensor 'w' appears twice"),
        CheckpointFormatError),
    CorpusCase("huge-header-length", _huge_header_length, CheckpointFormatError),
    CorpusCase("file-too-short", _file_bytes(b"\x01\x02\x03", "3 bytes, too short"), CheckpointFormatError),
    CorpusCase("file-empty", _file_bytes(b"", "0 bytes, too short"), CheckpointFormatError),
    CorpusCase("offsets-overlap", _edited(_overlap, repr(K0), repr(V0), "overlap", shard_of=K0),
               CheckpointFormatError),
    CorpusCase("offsets-gap", _gap_before_last, CheckpointFormatError),
    CorpusCase("data-not-fully-covered", _trailing_bytes, CheckpointFormatError),
    CorpusCase("empty-tensor-inside-another", _edited(_empty_inside, "'model.empty'", repr(K0), "overlap",
                                                      shard_of=K0), CheckpointFormatError),
    CorpusCase("offsets-reversed", _edited(_reversed_offsets, f"tensor {LAST!r}", "0 <= begin <= end"),
               CheckpointFormatError),
    CorpusCase("offsets-past-the-end", _edited(_past_the_end, f"tensor {LAST!r}", "run past the end of the data"),
               CheckpointFormatError),
    CorpusCase("dtype-shape-span-mismatch", _edited(_set(LAST, "shape", [31]), f"tensor {LAST!r}",
                                                   "span 128 bytes, but shape [31] of F32 needs 124"),
               CheckpointFormatError),
    CorpusCase("unknown-dtype", _edited(_set(LAST, "dtype", "Q4_K"), f"tensor {LAST!r}", "unknown dtype 'Q4_K'"),
               CheckpointFormatError),
    CorpusCase("negative-shape", _edited(_set(LAST, "shape", [-32]), f"tensor {LAST!r}", "non-negative integers"),
               CheckpointFormatError),
    CorpusCase("entry-lacks-offsets", _edited(_drop(LAST, "data_offsets"), f"tensor {LAST!r}",
                                              "lacks 'data_offsets'"), CheckpointFormatError),
    CorpusCase("metadata-not-strings", _edited(_set("__metadata__", "format", 3), "__metadata__", "'format'"),
               CheckpointFormatError),
    CorpusCase("duplicate-across-shards", _duplicate_across_shards, CheckpointFormatError),
    CorpusCase("index-parent-path", _index_pointing("../outside.safetensors", "points outside the model folder"),
               CheckpointFormatError),
    CorpusCase("index-absolute-path", _index_pointing(None, "points outside the model folder"),
               CheckpointFormatError),
    CorpusCase("index-symlink-out", _index_pointing("", symlink=True), CheckpointFormatError),
    CorpusCase("index-name-too-long", _index_pointing("x" * 300 + ".safetensors", "not a usable file name"),
               CheckpointFormatError),
    CorpusCase("index-missing-shard", _index_names_missing_shard, SourceNotFoundError),
    CorpusCase("index-not-json", _index_text("{oops", "weight index is not valid JSON"), ConfigError),
    CorpusCase("index-nested-too-deep", _index_text(DEEP, "weight index is not valid JSON"), ConfigError),
    CorpusCase("index-without-weight-map", _index_text('{"metadata": {}}', "'weight_map' must be"),
               CheckpointFormatError),
    CorpusCase("shard-is-a-fifo", _shard_is_a_fifo, SourceNotFoundError),
    CorpusCase("missing-tensor", _tensor_swap(LAST, None, "no weights for parameter(s) model.norm.weight"),
               MissingWeightsError),
    CorpusCase("unexpected-tensor", _tensor_swap("model.layers.0.mlp.extra.weight", torch.zeros(2),
                                                 "'model.layers.0.mlp.extra.weight'", "no parameter"),
               UnexpectedWeightError),
    CorpusCase("wrong-shape", _tensor_swap(LAST, torch.ones(16), repr(LAST), "expected shape (32,)",
                                           "found (16,)"), ShapeMismatchError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_malformed_safetensors_is_refused_naming_the_culprit(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


def test_the_undamaged_corpus_base_loads(tmp_path: Path) -> None:
    """The base every case damages is valid, so each failure is caused by its one change."""
    model = tmp_path / "model"
    tensors = write_llama_checkpoint(model)
    loaded = loader.load_model(str(model), dtype="float32")
    assert torch.equal(loaded.model.norm.weight, tensors[LAST])


def test_offsets_out_of_header_order_are_read_by_offset(tmp_path: Path) -> None:
    """Tensors whose bytes come in another order than their header entries are valid and load exactly."""
    model = tmp_path / "model"
    tensors = write_llama_checkpoint(model, shards=1)
    shard = model / "model.safetensors"
    header, data = read_raw_safetensors(shard)
    names = [k for k in header if k != "__metadata__"]
    reordered = {"__metadata__": header["__metadata__"], **{k: header[k] for k in reversed(names)}}
    write_raw_safetensors(shard, reordered, data)
    assert list(json.loads(shard.read_bytes()[8:data_start(shard)]))[1] == names[-1]
    loaded = loader.load_model(str(model), dtype="float32")
    assert torch.equal(loaded.lm_head.weight, tensors["lm_head.weight"])
    assert torch.equal(loaded.model.embed_tokens.weight, tensors[EMBED])


def test_symlink_inside_the_model_folder_is_allowed(tmp_path: Path) -> None:
    """A link that stays inside the model folder is fine (the real Hub cache: ``test_hub_cache.py``)."""
    model = tmp_path / "model"
    tensors = write_llama_checkpoint(model)
    shard = _second_shard(model)
    blobs = model / "blobs"
    blobs.mkdir()
    os.replace(shard, blobs / "abc123")
    shard.symlink_to(blobs / "abc123")
    linked = dict(safetensors_torch.load_file(str(blobs / "abc123")))
    assert shard.is_symlink() and {LAST, "lm_head.weight"} <= set(linked)
    loaded = loader.load_model(str(model), dtype="float32")
    assert torch.equal(loaded.model.norm.weight, tensors[LAST])
    assert torch.equal(loaded.lm_head.weight, tensors["lm_head.weight"])
    assert torch.equal(loaded.model.embed_tokens.weight, tensors[EMBED]), "the unlinked first shard too"
