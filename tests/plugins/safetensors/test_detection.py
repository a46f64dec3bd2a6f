"""``loader_detect_format``: safetensors before .bin, explicit formats, single files, indexes."""

from __future__ import annotations

from pathlib import Path

import pytest

from loader import _hooks as hooks
from loader._plugins import create_plugin_host
from loader.checkpoint import Source
from loader_plugin_safetensors.detection import detect_weight_format, is_training_artifact


def _touch(folder: Path, *names: str) -> None:
    for name in names:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x")


def _source(path: Path) -> Source:
    return Source(location=str(path), path=path)


def test_auto_prefers_safetensors_over_bin(tmp_path):
    _touch(tmp_path, "model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors",
           "model.safetensors.index.json", "pytorch_model.bin", "config.json")
    found = detect_weight_format(_source(tmp_path), "auto")
    assert found is not None
    assert found.name == "safetensors"
    assert found.files == (str(tmp_path / "model-00001-of-00002.safetensors"),
                           str(tmp_path / "model-00002-of-00002.safetensors"))
    assert found.index == str(tmp_path / "model.safetensors.index.json")


def test_auto_falls_back_to_pt_and_drops_training_artifacts(tmp_path):
    _touch(tmp_path, "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin",
           "pytorch_model.bin.index.json", "training_args.bin", "optimizer.pt", "optimizer.bin",
           "scheduler.pt", "scaler.pt", "rng_state_0.pth", "rng_state.pt", "extra.pt")
    found = detect_weight_format(_source(tmp_path), "auto")
    assert found is not None
    assert found.name == "pt"
    assert [Path(f).name for f in found.files] == [
        "extra.pt", "pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
    assert found.index == str(tmp_path / "pytorch_model.bin.index.json")


def test_explicit_format_answers_only_for_that_format(tmp_path):
    _touch(tmp_path, "model.safetensors", "pytorch_model.bin")
    pt = detect_weight_format(_source(tmp_path), "pt")
    assert pt is not None and pt.name == "pt" and pt.index is None
    assert pt.files == (str(tmp_path / "pytorch_model.bin"),)
    st = detect_weight_format(_source(tmp_path), "safetensors")
    assert st is not None and st.name == "safetensors"
    assert detect_weight_format(_source(tmp_path), "gguf") is None
    assert detect_weight_format(_source(tmp_path), "dummy") is None


def test_explicit_format_without_its_files_is_none(tmp_path):
    _touch(tmp_path, "pytorch_model.bin")
    assert detect_weight_format(_source(tmp_path), "safetensors") is None


def test_single_file_given_directly(tmp_path):
    _touch(tmp_path, "weights.safetensors", "weights.bin")
    st = detect_weight_format(_source(tmp_path / "weights.safetensors"), "auto")
    assert st is not None and st.name == "safetensors"
    assert st.files == (str(tmp_path / "weights.safetensors"),) and st.index is None
    pt = detect_weight_format(_source(tmp_path / "weights.bin"), "auto")
    assert pt is not None and pt.name == "pt"
    assert detect_weight_format(_source(tmp_path / "weights.bin"), "safetensors") is None


def test_original_subfolder_is_ignored(tmp_path):
    _touch(tmp_path, "original/consolidated.00.pth", "original/model.safetensors", "config.json")
    assert detect_weight_format(_source(tmp_path), "auto") is None
    _touch(tmp_path, "model.safetensors")
    found = detect_weight_format(_source(tmp_path), "auto")
    assert found is not None and found.files == (str(tmp_path / "model.safetensors"),)


def test_sharded_and_consolidated_both_listed_with_the_index(tmp_path):
    _touch(tmp_path, "consolidated.safetensors", "model-00001-of-00001.safetensors",
           "model.safetensors.index.json", "params.json")
    found = detect_weight_format(_source(tmp_path), "auto")
    assert found is not None
    assert [Path(f).name for f in found.files] == ["consolidated.safetensors",
                                                   "model-00001-of-00001.safetensors"]
    assert found.index == str(tmp_path / "model.safetensors.index.json")


def test_remote_source_is_left_to_other_plugins():
    assert detect_weight_format(Source(location="s3://b/p", path=None, uri="s3://b/p"), "auto") is None


@pytest.mark.parametrize("name", ["training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt",
                                  "rng_state_3.pth", "rng_state.pt"])
def test_training_artifacts(name):
    assert is_training_artifact(name)


def test_core_detect_format_reaches_the_plugin(tmp_path):
    _touch(tmp_path, "model.safetensors")
    host = create_plugin_host(environ={"LOADER_PLUGINS": "safetensors"})
    found = hooks.detect_format(_source(tmp_path), "auto", host=host)
    assert found.name == "safetensors"
