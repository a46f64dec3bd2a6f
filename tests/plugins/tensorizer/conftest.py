"""Fixtures: tiny Llama and tied Qwen2 checkpoints as safetensors, as tensorizer's own ``TensorSerializer``
writes them (plain and encrypted) and as ``save_tensorized`` writes them (tp=1 and 2, plain and encrypted);
one moto S3 server and one ranged HTTP server for the module's tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.hf_checkpoints import build_model
from tests.helpers.s3_server import CountingMotoServer, s3_environment, upload_folder
from tests.plugins.tensorizer.http_server import RangeHTTPServer

FAMILIES = ("llama", "qwen2")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def write_tensorizer_folder(model: Any, folder: Path, key: bytes | None = None) -> Path:
    """``model.tensors`` written by tensorizer's own serializer from a transformers model, config beside it."""
    from tensorizer import TensorSerializer
    from tensorizer.serialization import EncryptionParams

    folder.mkdir(parents=True)
    model.config.save_pretrained(folder)
    serializer = TensorSerializer(str(folder / "model.tensors"),
                                  encryption=EncryptionParams(key) if key is not None else None)
    serializer.write_module(model)
    serializer.close()
    return folder


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``{"<family>-<dtype>-<kind>": folder}`` for kinds ``st`` (safetensors), ``tz`` and ``tz-enc`` (tensorizer's
    serializer), ``w1``/``w2`` and ``w1-enc``/``w2-enc`` (``save_tensorized`` at tp=1/2), plus ``key``."""
    from loader_plugin_tensorizer import save_tensorized

    root = tmp_path_factory.mktemp("tensorizer")
    key = root / "key.bin"
    key.write_bytes(bytes(range(32)))
    found: dict[str, Path] = {"key": key}
    for family in FAMILIES:
        for dtype_name, dtype in DTYPES.items():
            name = f"{family}-{dtype_name}"
            model = build_model(family, dtype=dtype)
            model.save_pretrained(root / f"{name}-st")
            found[f"{name}-st"] = root / f"{name}-st"
            found[f"{name}-tz"] = write_tensorizer_folder(model, root / f"{name}-tz")
            found[f"{name}-tz-enc"] = write_tensorizer_folder(model, root / f"{name}-tz-enc", key.read_bytes())
            for tp in (1, 2):
                for suffix, encrypt in (("", None), ("-enc", key)):
                    out = root / f"{name}-w{tp}{suffix}"
                    save_tensorized(str(root / f"{name}-st"), out, tp_size=tp, dtype=dtype_name, encrypt=encrypt)
                    found[f"{name}-w{tp}{suffix}"] = out
    return found


@pytest.fixture(scope="session")
def s3_server() -> Iterator[CountingMotoServer]:
    server = CountingMotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_bucket(s3_server: CountingMotoServer, checkpoints: dict[str, Path]) -> Iterator[str]:
    """One bucket with every checkpoint folder under its own prefix, for the session."""
    import boto3

    with pytest.MonkeyPatch.context() as patch:
        for name, value in s3_environment(s3_server.endpoint).items():
            patch.setenv(name, value)
        client = boto3.client("s3", endpoint_url=s3_server.endpoint)
        bucket = f"tz-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        for name, folder in checkpoints.items():
            if folder.is_dir():
                upload_folder(client, folder, bucket, name)
        yield bucket


@pytest.fixture
def s3_env(s3_server: CountingMotoServer, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The AWS variables pointing at the shared server; returns the bucket."""
    for name, value in s3_environment(s3_server.endpoint).items():
        monkeypatch.setenv(name, value)
    return s3_bucket


@pytest.fixture(scope="session")
def http_root(checkpoints: dict[str, Path]) -> Iterator[str]:
    """``http://127.0.0.1:PORT/`` serving the checkpoints' parent folder with ranged GETs."""
    folder = next(iter(p for p in checkpoints.values() if p.is_dir())).parent
    server = RangeHTTPServer(folder)
    server.start()
    yield server.url
    server.stop()
