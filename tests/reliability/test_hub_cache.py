"""The Hugging Face cache as ``huggingface_hub`` writes it: checkpoints in it load, links out of it are refused.

Snapshot files are relative symlinks into the repository's ``blobs/``, so every file of a
cached checkpoint resolves outside its snapshot folder. The acceptance tests download a
sharded checkpoint with ``huggingface_hub``'s own ``hf_hub_download`` (from a Hub served on
``127.0.0.1``, :mod:`tests.helpers.hub_cache`) and load it offline by Hub id and by path;
the corpus cases (also run through the CLI) build the fake cache, which
``tests/core/test_hub.py`` checks against the real one, and link a file somewhere else.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import loader
from loader.errors import CheckpointFormatError, ConfigError
from tests.helpers.hub_cache import download_with_huggingface_hub, repo_folder, write_hub_cache
from tests.helpers.malformed import INDEX_NAME, write_llama_checkpoint
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

REPO = "acme/tiny-llama"
NORM = "model.norm.weight"


def _files(folder: Path, shards: int = 2) -> tuple[dict[str, bytes], dict[str, torch.Tensor]]:
    """A tiny Llama checkpoint's files (name -> bytes) and its tensors."""
    source = folder / "source"
    tensors = write_llama_checkpoint(source, shards=shards)
    return {p.name: p.read_bytes() for p in sorted(source.iterdir())}, tensors


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, torch.Tensor]]:
    """A sharded checkpoint downloaded by ``huggingface_hub``: (cache, snapshot, tensors)."""
    root = tmp_path_factory.mktemp("hub")
    files, tensors = _files(root)
    assert INDEX_NAME in files
    cache = root / "cache"
    snapshot = download_with_huggingface_hub(cache, REPO, files)
    assert all(os.readlink(snapshot / name).startswith("../../blobs/") for name in files)
    return cache, snapshot, tensors


@pytest.fixture
def offline(real_cache: tuple[Path, Path, dict[str, torch.Tensor]], monkeypatch: pytest.MonkeyPatch) -> Path:
    import huggingface_hub.constants as constants  # imported first: it reads HF_HUB_OFFLINE once, at import

    cache = real_cache[0]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_sharded_checkpoint_in_a_real_cache_loads_offline_by_hub_id(real_cache, offline) -> None:
    model = loader.load_model(REPO, dtype="float32")
    assert torch.equal(model.model.norm.weight, real_cache[2][NORM])


def test_sharded_checkpoint_in_a_real_cache_loads_by_snapshot_path(real_cache) -> None:
    model = loader.load_model(str(real_cache[1]), dtype="float32")
    assert torch.equal(model.model.norm.weight, real_cache[2][NORM])


def test_single_file_in_a_cache_loads_by_its_snapshot_path(tmp_path: Path) -> None:
    """A snapshot file links to ``blobs/<sha256>``: its own name, not the blob's, decides the format."""
    files, tensors = _files(tmp_path, shards=1)
    snapshot = write_hub_cache(tmp_path / "cache", REPO, files)
    model = loader.load_model(str(snapshot / "model.safetensors"), dtype="float32")
    assert torch.equal(model.model.norm.weight, tensors[NORM])


# -- the corpus: links that leave the model folder (or its cache repository's blobs) --------------------------

def _plain_link_out(name: str, *fragments: str, shards: int = 1):  # type: ignore[no-untyped-def]
    """A plain model folder (no index when ``shards`` is 1) whose ``name`` links to a copy beside the folder."""

    def build(folder: Path) -> Built:
        model = folder / "model"
        write_llama_checkpoint(model, shards=shards)
        outside = folder / f"outside-{name}"
        os.replace(model / name, outside)
        (model / name).symlink_to(outside)
        return Built(model, (str(model / name), str(outside), "outside the model folder", *fragments),
                     outside=outside)

    return build


def _cache_link_out(name: str, target: str, *fragments: str, shards: int = 2):  # type: ignore[no-untyped-def]
    """A cache snapshot whose ``name`` links to ``target`` (relative to the cache) holding the same bytes."""

    def build(folder: Path) -> Built:
        files, _ = _files(folder, shards=shards)
        cache = folder / "cache"
        snapshot = write_hub_cache(cache, REPO, files)
        outside = (cache / target).resolve()
        outside.parent.mkdir(parents=True, exist_ok=True)
        outside.write_bytes(files[name])
        (snapshot / name).unlink()
        (snapshot / name).symlink_to(os.path.relpath(outside, snapshot))
        blobs = repo_folder(cache, REPO) / "blobs"
        return Built(snapshot, (name, str(outside),
                                f"Hugging Face cache blobs {blobs}", *fragments), outside=outside)

    return build


CASES: list[CorpusCase] = [
    CorpusCase("weights-symlink-out", _plain_link_out("model.safetensors"), CheckpointFormatError),
    CorpusCase("config-symlink-out", _plain_link_out("config.json"), ConfigError),
    CorpusCase("cache-shard-links-to-another-repo",
               _cache_link_out("model-00002-of-00002.safetensors", "models--evil--repo/blobs/" + "e" * 64),
               CheckpointFormatError),
    CorpusCase("cache-weights-link-out-of-the-cache",
               _cache_link_out("model.safetensors", "../elsewhere/model.safetensors", shards=1),
               CheckpointFormatError),
    CorpusCase("cache-config-links-to-another-repo",
               _cache_link_out("config.json", "models--evil--repo/blobs/" + "c" * 40), ConfigError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_a_link_out_of_the_model_folder_is_refused(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


def test_a_file_linked_from_elsewhere_by_the_user_still_loads(tmp_path: Path) -> None:
    """Outside a cache, a file path the user gives is theirs to link: it resolves whole, to its real folder."""
    model = tmp_path / "model"
    tensors = write_llama_checkpoint(model, shards=1)
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "tiny.safetensors").symlink_to(model / "model.safetensors")
    loaded = loader.load_model(str(tmp_path / "links" / "tiny.safetensors"), dtype="float32")
    assert torch.equal(loaded.model.norm.weight, tensors[NORM])
