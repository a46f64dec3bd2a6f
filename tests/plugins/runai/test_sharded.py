"""``runai_streamer_sharded``: ``save-sharded`` output streamed, each rank fetching only its own objects."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader._sharded.save import save_sharded
from loader.errors import CheckpointFormatError, SourceNotFoundError, UnsupportedError
from loader.testing import simulated_tp
from tests.helpers.s3_server import CountingMotoServer, upload_folder


@pytest.fixture(scope="module")
def tp2_state(llama_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tp2") / "state"
    save_sharded(str(llama_checkpoint), out, tp_size=2, dtype="float32")
    return out


def _rank_state(source: str, rank: int, load_format: str) -> tuple[dict[str, torch.Tensor], Any]:
    with simulated_tp(rank, 2):
        model, report = loader.load_model_with_report(source, dtype="float32", load_format=load_format)
    return model.state_dict(), report


@pytest.mark.parametrize("rank", [0, 1])
def test_each_rank_fetches_only_its_own_objects(tp2_state: Path, s3_client: Any, bucket: str,
                                                s3_env: CountingMotoServer, rank: int) -> None:
    upload_folder(s3_client, tp2_state, bucket, "tp2")
    s3_env.reset_counts()
    streamed, report = _rank_state(f"s3://{bucket}/tp2", rank, "auto")
    assert report.load_format == "runai_streamer_sharded"
    assert report.files == (f"s3://{bucket}/tp2/model-rank-{rank}-part-0.safetensors",)
    local, _ = _rank_state(str(tp2_state), rank, "sharded_state")
    for name in local:
        assert torch.equal(streamed[name], local[name]), name
    own = f"{bucket}/tp2/model-rank-{rank}-part-0.safetensors"
    other = f"{bucket}/tp2/model-rank-{1 - rank}-part-0.safetensors"
    assert s3_env.bytes_served[other] == 0
    path = tp2_state / own.rsplit("/", 1)[1]
    size = path.stat().st_size
    # every byte once: the header by the core's parser, each tensor by the streamer (which parses no header)
    assert s3_env.bytes_served[own] == size
    assert 0 < report.bytes_read < size


def test_local_sharded_state_streams(tp2_state: Path) -> None:
    streamed, report = _rank_state(str(tp2_state), 1, "runai_streamer_sharded")
    local, _ = _rank_state(str(tp2_state), 1, "sharded_state")
    assert report.files == (str(tp2_state / "model-rank-1-part-0.safetensors"),)
    for name in local:
        assert torch.equal(streamed[name], local[name]), name


def test_wrong_tp_size_is_refused(tp2_state: Path, s3_client: Any, bucket: str) -> None:
    upload_folder(s3_client, tp2_state, bucket, "tp2")
    with pytest.raises(UnsupportedError, match=r"saved for tensor parallel size 2, but this load runs with 1"):
        loader.load_model(f"s3://{bucket}/tp2")


def test_sharded_format_needs_the_marker(llama_checkpoint: Path, s3_client: Any, bucket: str) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    with pytest.raises(SourceNotFoundError, match=r"needs a folder written by 'loader save-sharded'"):
        loader.load_model(f"s3://{bucket}/m", load_format="runai_streamer_sharded")
    with pytest.raises(SourceNotFoundError, match=r"needs a folder written by 'loader save-sharded'"):
        loader.load_model(str(llama_checkpoint), load_format="runai_streamer_sharded")


def test_missing_rank_part_is_refused(tp2_state: Path, s3_client: Any, bucket: str) -> None:
    upload_folder(s3_client, tp2_state, bucket, "tp2")
    s3_client.delete_object(Bucket=bucket, Key="tp2/model-rank-1-part-0.safetensors")
    with simulated_tp(1, 2), pytest.raises(loader.LoadError, match=r"no model-rank-1-part-\*.safetensors files"):
        loader.load_model(f"s3://{bucket}/tp2")


def test_save_sharded_from_s3_keeps_the_tokenizer(llama_checkpoint: Path, tmp_path: Path, s3_client: Any,
                                                  bucket: str) -> None:
    import shutil

    from tests.helpers.tokenizers_files import write_tokenizer

    folder = tmp_path / "ck"
    shutil.copytree(llama_checkpoint, folder)
    write_tokenizer(folder)
    upload_folder(s3_client, folder, bucket, "m")
    saved = save_sharded(f"s3://{bucket}/m", tmp_path / "out", tp_size=1, dtype="float32")
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    assert (tmp_path / "out" / "tokenizer_config.json").is_file()
    sharded = loader.load_model(saved.folder, dtype="float32")
    local = loader.load_model(str(llama_checkpoint), dtype="float32")
    for (name, a), (_, b) in zip(sharded.state_dict().items(), local.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.parametrize(("field", "value", "message"), [
    ("dtype", None, "field 'dtype' must be a dtype name, found nothing"),
    ("architecture", 7, "field 'architecture' must be an architecture name, found 7"),
    ("tp_size", True, "field 'tp_size' must be a positive integer, found true"),
])
def test_a_bad_marker_is_refused_as_the_core_refuses_it(tp2_state: Path, tmp_path: Path, s3_client: Any,
                                                        bucket: str, field: str, value: Any, message: str) -> None:
    """The marker passes the core's checks on ``s3://`` and locally, not a copy with fewer of them."""
    import json
    import shutil

    state = tmp_path / "state"
    shutil.copytree(tp2_state, state)
    marker = json.loads((state / "sharded_state.json").read_text())
    if value is None:
        del marker[field]
    else:
        marker[field] = value
    (state / "sharded_state.json").write_text(json.dumps(marker))
    upload_folder(s3_client, state, bucket, "tp2")
    for source, load_format in ((f"s3://{bucket}/tp2", "auto"), (str(state), "runai_streamer_sharded"),
                                (str(state), "sharded_state")):
        with simulated_tp(0, 2), pytest.raises(CheckpointFormatError, match=re.escape(message)):
            loader.load_model(source, dtype="float32", load_format=load_format)
