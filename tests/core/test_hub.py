"""Hub ids resolved from a local Hugging Face cache layout; the network is never used."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loader._options import LoadOptions
from loader._sources.builtin import loader_resolve_source, looks_like_hub_id
from loader.errors import SourceNotFoundError

REVISION = "0123456789abcdef0123456789abcdef01234567"


def _cache(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    folder = root / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / REVISION
    for name, data in files.items():
        path = snapshot / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(REVISION)
    return snapshot


@pytest.fixture
def offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as constants

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


def test_uri_schemes_are_left_to_plugins() -> None:
    assert loader_resolve_source("s3://bucket/prefix", OPTIONS) is None
