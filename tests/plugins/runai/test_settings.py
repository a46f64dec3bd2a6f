"""Streamer options: validated with a message per bad value, applied for one stream, passed from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import loader
from loader._cli.load_cmd import parse_format_options
from loader.errors import UnsupportedError
from loader_plugin_runai.settings import StreamerSettings, parse_byte_size
from tests.helpers.s3_server import CountingMotoServer, upload_folder


def test_options_map_to_the_streamer_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", raising=False)
    settings = StreamerSettings.from_options({"concurrency": "16", "memory_limit": "1GiB", "chunk_bytesize": 8 << 20})
    assert settings == StreamerSettings(concurrency=16, memory_limit=2**30, chunk_bytesize=8 << 20)
    # memory_limit is the plugin's staging ring, not the streamer's ring (which direct reads do not use)
    assert settings.environment() == {"RUNAI_STREAMER_CONCURRENCY": "16", "RUNAI_STREAMER_CHUNK_BYTESIZE": str(8 << 20)}
    assert StreamerSettings.from_options({}).environment() == {}
    assert StreamerSettings.from_options({"fs_strategy": "sync_buffered, io_uring_buffered"}).environment() == {
        "RUNAI_STREAMER_FS_STRATEGY": "sync_buffered,io_uring_buffered"}


def test_applied_sets_then_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNAI_STREAMER_CONCURRENCY", "3")
    monkeypatch.delenv("RUNAI_STREAMER_MEMORY_LIMIT", raising=False)
    monkeypatch.delenv("RUNAI_STREAMER_CHUNK_BYTESIZE", raising=False)
    with StreamerSettings(concurrency=9, chunk_bytesize=4096).applied():
        assert os.environ["RUNAI_STREAMER_CONCURRENCY"] == "9"
        assert os.environ["RUNAI_STREAMER_CHUNK_BYTESIZE"] == "4096"
    assert os.environ["RUNAI_STREAMER_CONCURRENCY"] == "3"
    assert "RUNAI_STREAMER_CHUNK_BYTESIZE" not in os.environ


def test_custom_endpoint_gets_path_style_addressing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", raising=False)
    assert StreamerSettings().environment() == {"RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0"}


@pytest.mark.parametrize(("options", "message"), [
    ({"concurency": 4}, r"unknown format option\(s\) 'concurency' for the Run:ai streamer; known: concurrency, "),
    ({"concurrency": 0}, r"'concurrency' must be between 1 and 1024, found 0"),
    ({"concurrency": True}, r"'concurrency' must be a whole number, found True"),
    ({"concurrency": "4k"}, r"'concurrency' must be a whole number, found '4k'"),
    ({"chunk_bytesize": True}, r"'chunk_bytesize' must be a number of bytes \(e.g. 1073741824 or '1GiB'\), found True"),
    ({"chunk_bytesize": "0"}, r"'chunk_bytesize' must be positive, found 0"),
    ({"memory_limit": -5}, r"'memory_limit' must be at least 1048576 bytes \(1MiB\), or -1 or 0 for the "
                           r"checkpoint's largest tensor, found -5"),
    ({"memory_limit": "512KiB"}, r"'memory_limit' must be at least 1048576 bytes \(1MiB\), .* found 524288"),
    ({"memory_limit": "lots"}, r"'memory_limit' must be a number of bytes \(e.g. 1073741824 or '1GiB'\), found 'lots'"),
    ({"memory_limit": "2TiB"}, r"found '2TiB'"),
    ({"memory_limit": 1.5}, r"found 1.5"),
    ({"fs_strategy": "mmap"}, r"'fs_strategy' must be one or more of io_uring_direct, io_uring_buffered, "
                              r"libaio_direct, sync_buffered \(comma-separated\), found 'mmap'"),
    ({"fs_strategy": 3}, r"'fs_strategy' must be one or more of .* found 3"),
])
def test_bad_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(UnsupportedError, match=message):
        StreamerSettings.from_options(options)


def test_byte_sizes() -> None:
    assert parse_byte_size("x", "512MiB") == 512 * 2**20
    assert parse_byte_size("x", " 2 gb ") == 2 * 10**9
    assert parse_byte_size("x", "-1") == -1


def test_cli_pairs() -> None:
    assert parse_format_options(["concurrency=4", " memory_limit = 1GiB "]) == {"concurrency": "4",
                                                                               "memory_limit": "1GiB"}
    for bad in ("concurrency", "=4", "concurrency="):
        with pytest.raises(UnsupportedError, match=r"--format-option expects KEY=VALUE, found"):
            parse_format_options([bad])


def test_memory_limit_below_the_minimum_fails_the_load(llama_checkpoint: Path) -> None:
    with pytest.raises(UnsupportedError, match=r"format option 'memory_limit' must be at least 1048576 bytes"):
        loader.load_model(str(llama_checkpoint), load_format="runai_streamer", format_options={"memory_limit": 1024})


def test_bad_option_fails_the_load(llama_checkpoint: Path) -> None:
    with pytest.raises(UnsupportedError, match=r"unknown format option\(s\) 'threads'"):
        loader.load_model(str(llama_checkpoint), load_format="runai_streamer", format_options={"threads": 2})


def test_cli_load_json_reports_bytes_fetched_and_speed(llama_checkpoint: Path, s3_client: Any, bucket: str,
                                                      s3_env: CountingMotoServer) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    done = subprocess.run(
        [sys.executable, "-m", "loader._cli.main", "load", f"s3://{bucket}/m", "--dtype", "float32", "--json",
         "--format-option", "concurrency=4", "--format-option", "memory_limit=-1"],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["load_format"] == "runai_streamer"
    assert report["bytes_read"] == report["checkpoint_bytes"] > 0
    assert report["gb_per_second"] >= 0 and report["seconds"] > 0


def test_cli_bad_option_is_one_line(llama_checkpoint: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loader._cli.main", "load", str(llama_checkpoint), "--format", "runai_streamer",
         "--format-option", "concurrency=none"],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: format option 'concurrency' must be a whole number, found 'none'"]
