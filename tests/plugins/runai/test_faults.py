"""Every way an ``s3://`` load can go wrong fails with a message naming what, and returns no model.

Faults are caused on a real server: a moto server of the test's own is killed
mid-load; objects are replaced or truncated through the S3 API while the
streamer is reading them; moto's authentication is switched on to refuse
unknown keys.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

import loader
from loader.errors import SourceNotFoundError
from loader_plugin_runai.errors import ObjectChangedError, StorageAccessError
from tests.helpers.s3_server import CountingMotoServer, s3_environment, upload_folder


def _load_fails(location: str, error: type[Exception], match: str) -> None:
    result: list[Any] = []
    with pytest.raises(error, match=match):
        result.append(loader.load_model(location))
    assert result == []


def test_missing_bucket(s3_env: Any) -> None:
    _load_fails("s3://no-such-bucket-here/m", SourceNotFoundError,
                r"s3://no-such-bucket-here/m/: bucket 'no-such-bucket-here' does not exist")


def test_missing_prefix(s3_client: Any, bucket: str) -> None:
    s3_client.put_object(Bucket=bucket, Key="other/config.json", Body=b"{}")
    _load_fails(f"s3://{bucket}/missing", SourceNotFoundError, rf"s3://{bucket}/missing/: no objects under this prefix")


def test_prefix_without_safetensors_files(llama_checkpoint: Path, s3_client: Any, bucket: str) -> None:
    s3_client.upload_file(str(llama_checkpoint / "config.json"), bucket, "m/config.json")
    s3_client.put_object(Bucket=bucket, Key="m/pytorch_model.bin", Body=b"pickle")
    _load_fails(f"s3://{bucket}/m", SourceNotFoundError,
                r"no \*.safetensors objects under this prefix \(found: config.json, pytorch_model.bin\)")


def test_malformed_uri_names_the_bucket(s3_env: Any) -> None:
    _load_fails("s3://No_Such/m", SourceNotFoundError, r"'No_Such' is not a valid bucket name")


def _set_moto_auth(endpoint: str, unauthenticated_requests_left: str) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/reset-auth", method="POST",
                                     data=unauthenticated_requests_left.encode(),
                                     headers={"Content-Type": "text/plain"})
    with urllib.request.urlopen(request) as reply:
        assert json.loads(reply.read())["status"] == "ok"


@pytest.fixture
def authenticating(s3_env: CountingMotoServer) -> Iterator[None]:
    """moto checks access keys from now on (it knows none, so every key is wrong)."""
    _set_moto_auth(s3_env.endpoint, "0")
    yield
    _set_moto_auth(s3_env.endpoint, "inf")


def test_wrong_credentials(llama_checkpoint: Path, s3_client: Any, bucket: str, authenticating: None,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG0")
    _load_fails(f"s3://{bucket}/m", StorageAccessError,
                rf"s3://{bucket}/m/: the server refused the credentials \(InvalidAccessKeyId")


@pytest.fixture
def own_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingMotoServer]:
    """A server of this test's own, since the test kills it."""
    server = CountingMotoServer()
    server.start()
    for name, value in s3_environment(server.endpoint).items():
        monkeypatch.setenv(name, value)
    yield server
    server.stop()


def _upload(server: CountingMotoServer, folder: Path) -> Any:
    import boto3

    client = boto3.client("s3", endpoint_url=server.endpoint)
    client.create_bucket(Bucket="models")
    upload_folder(client, folder, "models", "m")
    return client


def _after_data_gets(server: CountingMotoServer, count: int, action: Any) -> None:
    """Run ``action`` once, before the ``count``-th GET of a weight file is served."""
    seen = [0]

    def hook(key: str, byte_range: str | None) -> None:
        if key.endswith(".safetensors"):
            seen[0] += 1
            if seen[0] == count:
                action()

    server.on_get = hook


def test_server_stops_mid_load(llama_checkpoint: Path, own_server: CountingMotoServer) -> None:
    _upload(own_server, llama_checkpoint)
    headers = 2 * len(list(llama_checkpoint.glob("*.safetensors")))  # two ranged GETs per header, checked first
    _after_data_gets(own_server, headers + 20, own_server.kill)
    _load_fails("s3://models/m", StorageAccessError, r"s3://models/m/: streaming from object storage failed")


def _first_shard(folder: Path) -> Path:
    return sorted(folder.glob("model-*.safetensors"))[0]


def test_object_truncated_during_the_load(llama_checkpoint: Path, own_server: CountingMotoServer) -> None:
    client = _upload(own_server, llama_checkpoint)
    shard = _first_shard(llama_checkpoint)
    data = shard.read_bytes()

    def truncate() -> None:
        client.put_object(Bucket="models", Key=f"m/{shard.name}", Body=data[: len(data) // 2])

    _after_data_gets(own_server, 14, truncate)
    _load_fails("s3://models/m", ObjectChangedError,
                rf"s3://models/m/{shard.name}: changed while the load was reading it \(size {len(data)} -> "
                rf"{len(data) // 2} bytes\)")


def test_object_cut_inside_its_header_after_the_listing(llama_checkpoint: Path,
                                                       own_server: CountingMotoServer) -> None:
    """Cut between the listing and the header check: the change is named, not the torn header."""
    client = _upload(own_server, llama_checkpoint)
    shard = _first_shard(llama_checkpoint)
    data = shard.read_bytes()

    def truncate() -> None:
        client.put_object(Bucket="models", Key=f"m/{shard.name}", Body=data[:4])

    _after_data_gets(own_server, 1, truncate)
    _load_fails("s3://models/m", ObjectChangedError,
                rf"s3://models/m/{shard.name}: changed while the load was reading it \(size {len(data)} -> 4 bytes\)")


def test_object_replaced_during_the_load(llama_checkpoint: Path, own_server: CountingMotoServer,
                                         tmp_path: Path) -> None:
    client = _upload(own_server, llama_checkpoint)
    shard = _first_shard(llama_checkpoint)
    tensors = {name: t + 1 for name, t in load_file(shard).items()}
    save_file(tensors, tmp_path / "replacement.safetensors", metadata={"format": "pt"})
    replacement = (tmp_path / "replacement.safetensors").read_bytes()
    assert len(replacement) == shard.stat().st_size

    def replace() -> None:
        client.put_object(Bucket="models", Key=f"m/{shard.name}", Body=replacement)

    _after_data_gets(own_server, 14, replace)
    _load_fails("s3://models/m", ObjectChangedError,
                rf"s3://models/m/{shard.name}: replaced while the load was reading it")
