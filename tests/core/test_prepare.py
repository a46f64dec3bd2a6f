"""Step 1 of the pipeline: index filtering, training artifacts, original/**, bad indexes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loader._pipeline.prepare import filter_weight_files
from loader.checkpoint import Source, WeightFormat
from loader.errors import CheckpointFormatError, SourceNotFoundError


def _touch(folder: Path, *names: str) -> list[str]:
    paths = []
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")
        paths.append(str(path))
    return paths


def _index(folder: Path, weight_map: dict[str, str], name: str = "model.safetensors.index.json") -> str:
    path = folder / name
    path.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return str(path)


def test_index_keeps_only_named_shards(tmp_path: Path) -> None:
    files = _touch(tmp_path, "model-1.safetensors", "model-2.safetensors", "consolidated.safetensors")
    index = _index(tmp_path, {"a": "model-1.safetensors", "b": "model-2.safetensors"})
    fmt = filter_weight_files(Source("x", tmp_path), WeightFormat("safetensors", tuple(files), index))
    assert [Path(f).name for f in fmt.files] == ["model-1.safetensors", "model-2.safetensors"]


def test_training_artifacts_and_original_are_dropped(tmp_path: Path) -> None:
    files = _touch(tmp_path, "pytorch_model.bin", "training_args.bin", "optimizer.pt", "scheduler.pt",
                   "scaler.pt", "original/consolidated.bin")
    fmt = filter_weight_files(Source("x", tmp_path), WeightFormat("pt", tuple(files)))
    assert [Path(f).name for f in fmt.files] == ["pytorch_model.bin"]


def test_nothing_left_is_an_error(tmp_path: Path) -> None:
    files = _touch(tmp_path, "training_args.bin")
    with pytest.raises(SourceNotFoundError, match="no pt weight files left after filtering"):
        filter_weight_files(Source("x", tmp_path), WeightFormat("pt", tuple(files)))


def test_index_naming_a_missing_shard(tmp_path: Path) -> None:
    files = _touch(tmp_path, "model-1.safetensors")
    index = _index(tmp_path, {"a": "model-1.safetensors", "b": "model-2.safetensors"})
    with pytest.raises(SourceNotFoundError,
                       match="the index names shard\\(s\\) that do not exist: model-2.safetensors"):
        filter_weight_files(Source("x", tmp_path), WeightFormat("safetensors", tuple(files), index))


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd"])
def test_index_pointing_outside_the_folder(tmp_path: Path, target: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    files = _touch(model, "model-1.safetensors")
    index = _index(model, {"a": "model-1.safetensors", "b": target})
    with pytest.raises(CheckpointFormatError, match="points outside the model folder"):
        filter_weight_files(Source("x", model), WeightFormat("safetensors", tuple(files), index))


def test_shard_symlinked_out_of_the_folder(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    _touch(tmp_path, "secret.safetensors")
    os.symlink(tmp_path / "secret.safetensors", model / "model-1.safetensors")
    index = _index(model, {"a": "model-1.safetensors"})
    with pytest.raises(CheckpointFormatError, match="resolves to .*secret.safetensors, outside the model folder"):
        fmt = WeightFormat("safetensors", (str(model / "model-1.safetensors"),), index)
        filter_weight_files(Source("x", model), fmt)


def test_index_without_weight_map(tmp_path: Path) -> None:
    files = _touch(tmp_path, "model-1.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(CheckpointFormatError, match="'weight_map' must be a non-empty object"):
        filter_weight_files(Source("x", tmp_path), WeightFormat(
            "safetensors", tuple(files), str(tmp_path / "model.safetensors.index.json")))
