"""``load_format="runai_streamer"`` on local folders: the same model as the safetensors plugin loads."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader._generation import tokenizer_for
from loader.errors import SourceNotFoundError, UnsupportedError
from tests.helpers.s3_server import upload_folder
from tests.helpers.tokenizers_files import write_tokenizer


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_local_folder_streams_bit_equal(llama_checkpoint: Path) -> None:
    streamed, report = loader.load_model_with_report(str(llama_checkpoint), dtype="float32",
                                                     load_format="runai_streamer")
    _state_equal(streamed, loader.load_model(str(llama_checkpoint), dtype="float32"))
    assert report.load_format == "runai_streamer"
    assert report.bytes_read == report.checkpoint_bytes and report.bytes_mapped == 0


def test_local_auto_stays_with_the_safetensors_plugin(llama_checkpoint: Path) -> None:
    _, report = loader.load_model_with_report(str(llama_checkpoint), dtype="float32")
    assert report.load_format == "safetensors"


def test_local_index_filtering_applies(llama_checkpoint: Path, tmp_path: Path) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(llama_checkpoint, folder)
    (folder / "consolidated.safetensors").write_bytes(b"not read")
    _, report = loader.load_model_with_report(str(folder), dtype="float32", load_format="runai_streamer")
    assert not any("consolidated" in f for f in report.files)


def test_local_single_file_streams(llama_checkpoint: Path, tmp_path: Path) -> None:
    model = loader.load_model(str(llama_checkpoint), dtype="float32")
    from safetensors.torch import save_file

    folder = tmp_path / "one"
    folder.mkdir()
    shutil.copy(llama_checkpoint / "config.json", folder)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
    assert loader.load_model(str(folder / "model.safetensors"), load_format="runai_streamer") is not None


def test_local_folder_without_safetensors_is_refused(tmp_path: Path, llama_checkpoint: Path) -> None:
    shutil.copy(llama_checkpoint / "config.json", tmp_path)
    with pytest.raises(SourceNotFoundError, match=r"no \*.safetensors files to stream"):
        loader.load_model(str(tmp_path), load_format="runai_streamer")


def test_local_file_that_is_not_safetensors_is_refused(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(SourceNotFoundError, match=r"model.bin: load_format 'runai_streamer' reads .safetensors"):
        loader.load_model(str(tmp_path / "model.bin"), load_format="runai_streamer")


def test_other_formats_on_s3_are_refused(llama_checkpoint: Path, s3_client: Any, bucket: str) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    with pytest.raises(UnsupportedError, match=r"load_format 'gguf' is not provided"):
        loader.load_model(f"s3://{bucket}/m", load_format="gguf")


def test_tokenizer_comes_from_s3(llama_checkpoint: Path, tmp_path: Path, s3_client: Any, bucket: str) -> None:
    folder = tmp_path / "ck"
    shutil.copytree(llama_checkpoint, folder)
    write_tokenizer(folder)
    upload_folder(s3_client, folder, bucket, "m")
    remote = tokenizer_for(f"s3://{bucket}/m")
    local = tokenizer_for(str(folder))
    assert remote.tokenizer.encode("w7 w9 w11").ids == local.tokenizer.encode("w7 w9 w11").ids
    assert remote.chat_template == local.chat_template and remote.eos_token_ids == local.eos_token_ids


def test_buffered_strategy_reads_through_the_page_cache(llama_checkpoint: Path) -> None:
    streamed = loader.load_model(str(llama_checkpoint), dtype="float32", load_format="runai_streamer",
                                 format_options={"fs_strategy": "sync_buffered", "concurrency": 2})
    _state_equal(streamed, loader.load_model(str(llama_checkpoint), dtype="float32"))
