"""Hub ids resolved from a local Hugging Face cache layout; the network is never used."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import pytest
import torch

from loader._options import LoadOptions
from loader._sources.builtin import loader_resolve_source, looks_like_hub_id
from loader.errors import SourceNotFoundError
from tests.helpers.hub_cache import cache_tree, download_with_huggingface_hub, repo_folder, write_hub_cache
from tests.helpers.hub_server import point_huggingface_hub_at


def _cache(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    return write_hub_cache(root, repo, files)


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants as constants  # imported first: it reads HF_HUB_OFFLINE once, at import

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    return tmp_path


OPTIONS = LoadOptions(dtype=torch.float32, device=torch.device("cpu"))


@pytest.mark.parametrize(("location", "expected"), [
    ("org/name", True), ("name", True), ("org/name.v2-x_y", True),
    ("a/b/c", False), ("../x", False), ("org/../x", False), ("model.gguf", False),
])
def test_hub_id_shape(location: str, expected: bool) -> None:
    assert looks_like_hub_id(location) is expected


def test_hub_id_resolves_to_cached_snapshot(offline_cache: Path) -> None:
    snapshot = _cache(offline_cache, "acme/tiny", {"config.json": b"{}", "model.safetensors": b"x"})
    source = loader_resolve_source("acme/tiny", OPTIONS)
    assert source is not None
    assert source.path == snapshot
    assert source.location == "acme/tiny"


def test_local_path_wins_over_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    source = loader_resolve_source("org/name", OPTIONS)
    assert source is not None and source.path == (tmp_path / "org" / "name").resolve()


def test_uncached_hub_id_offline_says_so(offline_cache: Path) -> None:
    with pytest.raises(SourceNotFoundError, match="acme/absent: not a local path, and not in the Hugging Face cache"):
        loader_resolve_source("acme/absent", OPTIONS)


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the Hub must not be asked")

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", refuse)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)


@pytest.mark.parametrize("location", ["./nope", "/no/such/folder", "~/no-such-model", "models/llama/7b",
                                      "model.gguf", "weights.safetensors", "folder\\model"])
def test_missing_path_like_location_is_a_missing_path(location: str, no_hub: None, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceNotFoundError, match=rf"^{re.escape(location)}: no such file or directory$"):
        loader_resolve_source(location, OPTIONS)


@pytest.fixture
def unreachable_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_ENDPOINT on a closed local port: every request is refused at once, nothing leaves the machine."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    point_huggingface_hub_at(f"http://127.0.0.1:{port}", tmp_path, monkeypatch)
    return tmp_path


def test_unreachable_hub_fails_in_seconds_naming_offline(unreachable_hub: Path) -> None:
    started = time.monotonic()
    with pytest.raises(SourceNotFoundError) as err:
        loader_resolve_source("acme/absent", OPTIONS)
    assert time.monotonic() - started < 5
    message = str(err.value)
    assert message.startswith("acme/absent: the Hugging Face Hub cannot be reached (ConnectError: ")
    assert "Connection refused" in message  # the closed local port, not a DNS failure for huggingface.co
    assert message.endswith("and the repository is not in the local cache; check the network, or download "
                            "it first and set HF_HUB_OFFLINE=1 to work offline")
    assert "\n" not in message


def test_unreachable_hub_falls_back_to_the_cached_repository(unreachable_hub: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    snapshot = _cache(unreachable_hub, "acme/tiny", {"config.json": b"{}", "model.safetensors": b"x"})
    with caplog.at_level("WARNING", logger="loader"):
        source = loader_resolve_source("acme/tiny", OPTIONS)
    assert source is not None and source.path == snapshot
    assert any("cannot be reached (ConnectError); using the cached snapshot" in r.getMessage()
               for r in caplog.records)


def test_uri_schemes_are_left_to_plugins() -> None:
    assert loader_resolve_source("s3://bucket/prefix", OPTIONS) is None


def test_the_fake_cache_is_the_layout_huggingface_hub_writes(tmp_path: Path) -> None:
    """``write_hub_cache`` (used by fast tests) against ``hf_hub_download`` itself: same blobs, links and refs."""
    files = {"config.json": b'{"architectures": []}', "model-00001-of-00002.safetensors": b"x" * 100,
             "model-00002-of-00002.safetensors": b"y" * 50, "model.safetensors.index.json": b"{}",
             "sub/tokenizer.json": b"{}"}
    real = download_with_huggingface_hub(tmp_path / "real", "acme/tiny", files)
    fake = write_hub_cache(tmp_path / "fake", "acme/tiny", files)
    assert real.relative_to(tmp_path / "real") == fake.relative_to(tmp_path / "fake")
    assert os.readlink(real / "sub" / "tokenizer.json").startswith("../../../blobs/")
    assert cache_tree(repo_folder(tmp_path / "real", "acme/tiny")) == cache_tree(repo_folder(tmp_path / "fake",
                                                                                              "acme/tiny"))
