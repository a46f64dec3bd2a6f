"""Fixtures: one moto S3 server and one GCS emulator for the session, a fresh bucket per test, checkpoints.

The servers are real (moto in server mode, gcp-storage-emulator, both on 127.0.0.1); the environment points
the plugin's clients and the Run:ai streamer at them for as long as a test runs. Azurite (``az://``) has its
fixtures in test_azure.py, the only module that needs it.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.gcs_server import GcsEmulator, gcs_environment
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


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[GcsEmulator]:
    """One GCS emulator for the session (started in well under a second)."""
    server = GcsEmulator()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def gcs_client(gcs_server: GcsEmulator, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A client of the shared emulator, with the variables pointing the plugin and the streamer at it."""
    for name, value in gcs_environment(gcs_server.endpoint).items():
        monkeypatch.setenv(name, value)
    return gcs_server.client()


@pytest.fixture
def gcs_bucket(gcs_client: Any) -> str:
    """A new empty bucket for this test."""
    name = f"b-{uuid.uuid4().hex[:12]}"
    gcs_client.create_bucket(name)
    return name
