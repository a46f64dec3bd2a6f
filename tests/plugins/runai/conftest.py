"""Fixtures: one moto S3 server for the module's tests, a fresh bucket per test, checkpoints to upload.

The server is real (moto in server mode on 127.0.0.1); the environment points
boto3 and the Run:ai streamer at it for as long as a test runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.hf_checkpoints import save_checkpoint
from tests.helpers.s3_server import CountingMotoServer, s3_environment


@pytest.fixture(scope="session")
def s3_server() -> Iterator[CountingMotoServer]:
    server = CountingMotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_env(s3_server: CountingMotoServer, monkeypatch: pytest.MonkeyPatch) -> CountingMotoServer:
    """The AWS variables pointing at the shared server, counts reset."""
    for name, value in s3_environment(s3_server.endpoint).items():
        monkeypatch.setenv(name, value)
    s3_server.reset_counts()
    s3_server.on_get = None
    return s3_server


@pytest.fixture
def s3_client(s3_env: CountingMotoServer) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=s3_env.endpoint)


@pytest.fixture
def bucket(s3_client: Any) -> str:
    """A new empty bucket for this test."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def llama_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama in several safetensors shards with an index (float32)."""
    path = tmp_path_factory.mktemp("llama")
    save_checkpoint("llama", path)
    return path
