"""``az://`` through the streamer's Azure backend, against Azurite (npm) on 127.0.0.1: the same model as a local
load, and every fault named as on ``s3://``.

Loads that reach the streamer run in a child process whose mount namespace trusts Azurite's certificate
(see tests/helpers/azurite_server.py); faults caught while listing run in this process.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import loader
from loader.errors import SourceNotFoundError
from loader_plugin_runai.errors import StorageAccessError
from tests.helpers.azurite_server import Azurite, azurite_blob, namespace_command
from tests.helpers.child_loads import child_load
from tests.helpers.malformed import data_start
from tests.helpers.s3_server import free_port


@pytest.fixture(scope="module")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Azurite]:
    program = azurite_blob()
    if program is None:
        pytest.skip("az:// tests need npm and node to install and run Azurite")
    server = Azurite(program, tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()


@pytest.fixture
def az_env(azurite: Azurite, monkeypatch: pytest.MonkeyPatch) -> Azurite:
    for name, value in azurite.environment().items():
        monkeypatch.setenv(name, value)
    return azurite


@pytest.fixture
def container(az_env: Azurite) -> str:
    from azure.storage.blob import BlobServiceClient

    name = f"c-{uuid.uuid4().hex[:12]}"
    BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"]).create_container(name)
    return name


def _upload(folder: Path, container: str, prefix: str) -> None:
    from azure.storage.blob import BlobServiceClient

    client = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
    for path in sorted(folder.iterdir()):
        if path.is_file():
            client.get_blob_client(container, f"{prefix}/{path.name}").upload_blob(path.read_bytes())


def _child_load(azurite: Azurite, source: str, dtype: str, out: Path, *extra: str) -> dict[str, Any]:
    wrap = namespace_command(azurite.bundle, [])
    if wrap is None:
        pytest.skip("no private mount namespace here (unshare --mount --map-root-user) to trust Azurite's certificate")
    return child_load(source, dtype, out, *extra, wrap=wrap)


def test_az_load_is_bit_equal_to_the_local_load(llama_checkpoint: Path, container: str, az_env: Azurite,
                                                tmp_path: Path) -> None:
    _upload(llama_checkpoint, container, "m")
    result = _child_load(az_env, f"az://{container}/m", "float32", tmp_path / "az")
    assert "state" in result, result
    local = loader.load_model(str(llama_checkpoint), dtype="float32").state_dict()
    assert list(result["state"]) == list(local)
    for name, value in local.items():
        assert torch.equal(result["state"][name], value), name


def test_object_truncated_after_the_listing(llama_checkpoint: Path, container: str, az_env: Azurite,
                                            tmp_path: Path) -> None:
    _upload(llama_checkpoint, container, "m")
    shard = sorted(llama_checkpoint.glob("model-*.safetensors"))[0]
    size, cut = shard.stat().st_size, data_start(shard) + 100
    (tmp_path / "cut").write_bytes(shard.read_bytes()[:cut])
    result = _child_load(az_env, f"az://{container}/m", "float32", tmp_path / "az", "--after-listing", shard.name,
                         str(tmp_path / "cut"))
    assert result.get("error") == "ObjectChangedError", result
    assert result["message"] == (f"az://{container}/m/{shard.name}: changed while the load was reading it (size {size}"
                                 f" -> {cut} bytes); nothing was loaded, try again once the upload is complete")


def _load_fails(location: str, error: type[Exception], match: str) -> None:
    result: list[Any] = []
    with pytest.raises(error, match=match) as caught:
        result.append(loader.load_model(location))
    assert result == [] and "\n" not in str(caught.value)


def test_missing_container(az_env: Azurite) -> None:
    _load_fails("az://no-such-container/m", SourceNotFoundError,
                r"az://no-such-container/m/: container 'no-such-container' does not exist")


def test_missing_prefix(container: str, az_env: Azurite) -> None:
    _load_fails(f"az://{container}/missing", SourceNotFoundError,
                rf"az://{container}/missing/: no objects under this prefix")


def test_wrong_account_key(llama_checkpoint: Path, container: str, az_env: Azurite,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    _upload(llama_checkpoint, container, "m")
    wrong = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ=="
    for name, value in az_env.environment(key=wrong).items():
        monkeypatch.setenv(name, value)
    _load_fails(f"az://{container}/m", StorageAccessError,
                rf"az://{container}/m/: the server refused the credentials \(AuthorizationFailure\)")


def test_unreachable_endpoint_fails_fast_on_one_line(az_env: Azurite, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", az_env.environment()["AZURE_STORAGE_CONNECTION_STRING"]
                       .replace(str(az_env.port), str(port)))
    start = time.monotonic()
    _load_fails("az://models/m", StorageAccessError, rf"az://models/m/: cannot reach https://127.0.0.1:{port}/")
    assert time.monotonic() - start < 15
