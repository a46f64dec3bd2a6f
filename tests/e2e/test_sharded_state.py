"""save-sharded then load_format="sharded_state": same logits, each rank reads only its own files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import loader
from loader._sharded.save import save_sharded
from loader.errors import CheckpointFormatError, SourceNotFoundError, UnsupportedError
from tests.helpers.hf_checkpoints import save_checkpoint

WORKER = Path(__file__).parent / "scripts" / "sharded_worker.py"


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("llama")
    save_checkpoint("llama", path)
    return path


def test_round_trip_at_tp1_is_bit_exact(llama_checkpoint: Path, tmp_path: Path) -> None:
    saved = save_sharded(str(llama_checkpoint), tmp_path / "tp1", tp_size=1, dtype="float32")
    assert [Path(f).name for f in saved.files] == ["model-rank-0-part-0.safetensors"]
    full = loader.load_model(str(llama_checkpoint), dtype="float32")
    sharded, report = loader.load_model_with_report(str(tmp_path / "tp1"), dtype="float32")
    assert report.load_format == "sharded_state"
    for (name, a), (_, b) in zip(full.state_dict().items(), sharded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_parts_are_split_by_size(llama_checkpoint: Path, tmp_path: Path) -> None:
    saved = save_sharded(str(llama_checkpoint), tmp_path / "parts", tp_size=1, dtype="float32",
                         max_part_bytes=100_000)
    assert len(saved.files) > 2
    model = loader.load_model(str(tmp_path / "parts"), dtype="float32", load_format="sharded_state")
    assert model(torch.tensor([[1, 2]])).shape == (1, 2, 256)


def test_wrong_tp_size_is_refused(llama_checkpoint: Path, tmp_path: Path) -> None:
    save_sharded(str(llama_checkpoint), tmp_path / "tp2", tp_size=2, dtype="float32")
    with pytest.raises(UnsupportedError, match="saved for tensor parallel size 2, but this load runs with 1"):
        loader.load_model(str(tmp_path / "tp2"))


def test_sharded_state_needs_the_marker(llama_checkpoint: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="needs a folder written by 'loader save-sharded'"):
        loader.load_model(str(llama_checkpoint), load_format="sharded_state")


def test_output_folder_must_be_empty(llama_checkpoint: Path, tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(SourceNotFoundError, match="output folder exists and is not empty"):
        save_sharded(str(llama_checkpoint), tmp_path / "busy", tp_size=1)


def _torchrun(source: Path, load_format: str, prefix: Path) -> list[tuple[torch.Tensor, dict]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    str(WORKER), str(source), load_format, str(prefix)],
                   check=True, env=env, timeout=240, capture_output=True)
    return [(torch.load(f"{prefix}-rank{r}.pt"), json.loads(Path(f"{prefix}-rank{r}.json").read_text()))
            for r in range(2)]


@pytest.mark.torchrun
def test_tp2_sharded_state_matches_full_checkpoint(llama_checkpoint: Path, tmp_path: Path) -> None:
    save_sharded(str(llama_checkpoint), tmp_path / "tp2", tp_size=2, dtype="float32")
    full = _torchrun(llama_checkpoint, "auto", tmp_path / "full")
    sharded = _torchrun(tmp_path / "tp2", "sharded_state", tmp_path / "sharded")
    for (a, report_full), (b, report_sharded) in zip(full, sharded, strict=True):
        assert torch.equal(a, b)
        assert report_sharded["load_format"] == "sharded_state"
        assert len(report_sharded["files"]) == 1
        assert report_sharded["bytes_read"] <= 0.55 * report_full["checkpoint_bytes"]


def test_sharded_state_loads_without_any_safetensors_plugin(llama_checkpoint: Path, tmp_path: Path) -> None:
    """The core reads its own part files: no plugin serving the 'safetensors' format is needed."""
    from loader._plugins import create_plugin_host

    save_sharded(str(llama_checkpoint), tmp_path / "own", tp_size=1, dtype="float32")
    host = create_plugin_host(environ={"LOADER_DISABLE_PLUGINS": "safetensors"})
    assert host.records["safetensors"].status == "blocked"
    sharded, report = loader.load_model_with_report(str(tmp_path / "own"), dtype="float32", host=host)
    full = loader.load_model(str(llama_checkpoint), dtype="float32")
    assert report.load_format == "sharded_state" and report.bytes_read > 0
    ids = torch.tensor([[1, 2, 3, 250]])
    assert torch.equal(sharded(ids), full(ids))

def test_a_part_linking_out_of_the_folder_is_refused(llama_checkpoint: Path, tmp_path: Path) -> None:
    """The model folder's one rule (loader._model_folder) holds for sharded-state parts too."""
    save_sharded(str(llama_checkpoint), tmp_path / "tp1", tp_size=1, dtype="float32")
    saved = tmp_path / "tp1"
    part = saved / "model-rank-0-part-0.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    os.replace(part, outside)
    part.symlink_to(outside)
    with pytest.raises(CheckpointFormatError, match=r"model-rank-0-part-0\.safetensors resolves to .*elsewhere"
                                                    r"\.safetensors, outside the model folder"):
        loader.load_model(str(saved), dtype="float32")
