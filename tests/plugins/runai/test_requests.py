"""How many requests an ``s3://`` command sends: sizes come from the one listing, one client serves a prefix,
and the headers of a prefix are read at once.

``loader inspect`` needs each object's size to check its header (the tensors
must cover the object exactly); the listing already holds it, so a HEAD per
file would only add round trips, as would reading the headers one after
another. The end-of-load identity check asks each object's ETag
again, through the client that listed the prefix rather than a new one per check.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import loader
import loader_plugin_runai.object_store as object_store
from loader._cli.inspect_cmd import inspect_source
from loader_plugin_runai.headers import HEADER_READERS
from tests.helpers.s3_server import CountingMotoServer, upload_folder


def _shards(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.safetensors"))


def test_inspect_sends_no_head_and_two_ranged_gets_per_shard(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                                             s3_env: CountingMotoServer) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_env.reset_counts()
    inspect_source(f"s3://{bucket}/m")
    heads = {key: n for (method, key), n in s3_env.requests.items() if method == "HEAD"}
    assert heads == {}
    shards = _shards(llama_checkpoint)
    assert len(shards) > 1
    for shard in shards:
        assert s3_env.requests[("GET", f"{bucket}/m/{shard}")] == 2, shard  # the length, then the header


def test_the_headers_of_a_prefix_are_read_at_once(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                                  s3_env: CountingMotoServer) -> None:
    """The first header GETs (each shard's length) are all in flight before the first is answered: a load waits
    two round trips per :data:`HEADER_READERS` shards for its headers, not two per shard."""
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    together = min(len(_shards(llama_checkpoint)), HEADER_READERS)
    assert together > 1
    arrived = threading.Barrier(together, timeout=10)
    held: list[str] = []
    broken: list[str] = []
    lock = threading.Lock()

    def hold_header_gets(key: str, byte_range: str | None) -> None:
        if byte_range != "bytes=0-7" or not key.endswith(".safetensors"):
            return
        with lock:
            if len(held) == together:
                return
            held.append(key)
        try:
            arrived.wait()
        except threading.BrokenBarrierError:
            broken.append(key)

    s3_env.on_get = hold_header_gets
    inspect_source(f"s3://{bucket}/m")
    assert broken == []


@pytest.fixture
def clients(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every boto3 client the plugin builds."""
    built: list[object] = []
    make = object_store._client

    def counting() -> Any:
        client = make()
        built.append(client)
        return client

    monkeypatch.setattr(object_store, "_client", counting)
    return built


def test_a_load_builds_one_client_and_verifies_each_shard_once(
    llama_checkpoint: Path, s3_client: Any, bucket: str, s3_env: CountingMotoServer, clients: list[object]
) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_env.reset_counts()
    loader.load_model(f"s3://{bucket}/m", dtype="float32")
    assert len(clients) == 1
    shards = _shards(llama_checkpoint)
    for shard in shards:
        assert s3_env.requests[("HEAD", f"{bucket}/m/{shard}")] == 1, shard  # the identity check, once


def test_inspect_builds_one_client(llama_checkpoint: Path, s3_client: Any, bucket: str, s3_env: CountingMotoServer,
                                   clients: list[object]) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    inspect_source(f"s3://{bucket}/m")
    assert len(clients) == 1
