"""``gs://`` through the streamer's GCS backend, against a GCS emulator on 127.0.0.1: the same model as a local
load, and every fault named as on ``s3://`` (the emulator checks no credentials, so refused keys are not tested).

Loads that reach the streamer run in a child process (tests/helpers/child_loads.py): the streamer keeps the first
object-store backend a process loads, and this test process streams ``s3://`` too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import loader
from loader.errors import SourceNotFoundError, UnsupportedError
from loader_plugin_runai import range_reads
from loader_plugin_runai.errors import ObjectChangedError, StorageAccessError
from loader_plugin_runai.object_folder import ObjectFolder
from tests.helpers.child_loads import child_load
from tests.helpers.gcs_server import upload_folder_gcs
from tests.helpers.malformed import data_start
from tests.helpers.s3_server import free_port


def _state_equal(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def _load_fails(location: str, error: type[Exception], match: str) -> str:
    result: list[Any] = []
    with pytest.raises(error, match=match) as caught:
        result.append(loader.load_model(location))
    assert result == [] and "\n" not in str(caught.value)
    return str(caught.value)


def test_gs_load_is_bit_equal_to_the_local_load(llama_checkpoint: Path, gcs_client: Any, gcs_bucket: str,
                                                tmp_path: Path) -> None:
    upload_folder_gcs(gcs_client, llama_checkpoint, gcs_bucket, "m")
    result = child_load(f"gs://{gcs_bucket}/m", "float32", tmp_path / "gs")
    assert "state" in result, result
    local = loader.load_model(str(llama_checkpoint), dtype="float32").state_dict()
    assert list(result["state"]) == list(local)
    for name, value in local.items():
        assert torch.equal(result["state"][name], value), name


def test_a_second_object_store_in_one_process_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(range_reads, "_backend", ["s3"])
    with pytest.raises(UnsupportedError, match=r"gs://b/m/x.safetensors: this process already streamed from s3://, "
                                               r"and the Run:ai streamer keeps the first object-store backend"):
        range_reads.claim_backend("gs", "gs://b/m/x.safetensors")
    range_reads.claim_backend("s3", "s3://b/m")  # the same scheme again is fine


def test_missing_bucket(gcs_client: Any) -> None:
    _load_fails("gs://no-such-bucket-here/m", SourceNotFoundError,
                r"gs://no-such-bucket-here/m/: bucket 'no-such-bucket-here' does not exist")


def test_missing_prefix(gcs_client: Any, gcs_bucket: str) -> None:
    gcs_client.bucket(gcs_bucket).blob("other/config.json").upload_from_string(b"{}")
    _load_fails(f"gs://{gcs_bucket}/missing", SourceNotFoundError,
                rf"gs://{gcs_bucket}/missing/: no objects under this prefix")


def test_unreachable_endpoint_fails_fast_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", nobody)
    monkeypatch.setenv("CLOUD_STORAGE_EMULATOR_ENDPOINT", nobody)
    start = time.monotonic()
    _load_fails("gs://models/m", StorageAccessError, rf"gs://models/m/: cannot reach {nobody}: ")
    assert time.monotonic() - start < 15


def _after_listing(monkeypatch: pytest.MonkeyPatch, action: Callable[[], None]) -> None:
    """Run ``action`` once, right after the load lists the prefix (before a header or tensor is read)."""
    listing = ObjectFolder.listing
    done: list[bool] = []

    def listed(self: ObjectFolder) -> Any:
        found = listing(self)
        if not done:
            done.append(True)
            action()
        return found

    monkeypatch.setattr(ObjectFolder, "listing", listed)


def _first_shard(folder: Path) -> Path:
    return sorted(folder.glob("model-*.safetensors"))[0]


def test_object_cut_inside_its_header_after_the_listing(llama_checkpoint: Path, gcs_client: Any, gcs_bucket: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut before the header check (no streamer involved): the change is named, not the torn header."""
    upload_folder_gcs(gcs_client, llama_checkpoint, gcs_bucket, "m")
    shard = _first_shard(llama_checkpoint)
    blob = gcs_client.bucket(gcs_bucket).blob(f"m/{shard.name}")
    _after_listing(monkeypatch, lambda: blob.upload_from_string(shard.read_bytes()[:4]))
    _load_fails(f"gs://{gcs_bucket}/m", ObjectChangedError,
                rf"gs://{gcs_bucket}/m/{shard.name}: changed while the load was reading it \(size "
                rf"{shard.stat().st_size} -> 4 bytes\)")


def test_object_truncated_after_the_listing(llama_checkpoint: Path, gcs_client: Any, gcs_bucket: str,
                                            tmp_path: Path) -> None:
    upload_folder_gcs(gcs_client, llama_checkpoint, gcs_bucket, "m")
    shard = _first_shard(llama_checkpoint)
    size, cut = shard.stat().st_size, data_start(shard) + 100
    (tmp_path / "cut").write_bytes(shard.read_bytes()[:cut])
    result = child_load(f"gs://{gcs_bucket}/m", "float32", tmp_path / "gs", "--after-listing", shard.name,
                        str(tmp_path / "cut"))
    assert result.get("error") == "ObjectChangedError", result
    assert result["message"] == (f"gs://{gcs_bucket}/m/{shard.name}: changed while the load was reading it (size "
                                 f"{size} -> {cut} bytes); nothing was loaded, try again once the upload is complete")


def test_object_replaced_after_the_listing(llama_checkpoint: Path, gcs_client: Any, gcs_bucket: str,
                                           tmp_path: Path) -> None:
    upload_folder_gcs(gcs_client, llama_checkpoint, gcs_bucket, "m")
    shard = _first_shard(llama_checkpoint)
    save_file({n: t + 1 for n, t in load_file(shard).items()}, tmp_path / "r.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "r.safetensors").stat().st_size == shard.stat().st_size
    result = child_load(f"gs://{gcs_bucket}/m", "float32", tmp_path / "gs", "--after-listing", shard.name,
                        str(tmp_path / "r.safetensors"))
    assert result.get("error") == "ObjectChangedError", result
    assert result["message"].startswith(f"gs://{gcs_bucket}/m/{shard.name}: replaced while the load was reading it")
