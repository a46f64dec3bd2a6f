"""Hugging Face cache folders for tests: written by ``huggingface_hub`` itself, or faked by hand.

The real layout (``models--org--name/{blobs,snapshots,refs}``, every snapshot file a
relative symlink ``../../blobs/<etag>``) matters: a loader that only ever sees a fake can
refuse the real one. :func:`download_with_huggingface_hub` makes ``huggingface_hub``'s own
``hf_hub_download`` write the cache, against a Hub served from this process on
``127.0.0.1`` (:mod:`tests.helpers.hub_server`) that answers the two requests it makes per file
(``HEAD`` for the commit, ETag and size, ``GET`` for the bytes) the way huggingface.co does: ETag the sha256 for files
stored in LFS (weights), the git blob sha1 for the rest. :func:`write_hub_cache` writes the
same tree by hand, fast; ``tests/core/test_hub.py`` checks the two agree.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

__all__ = ["COMMIT", "cache_tree", "download_with_huggingface_hub", "hub_etag", "repo_folder", "served_repo",
           "write_hub_cache"]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def hub_etag(name: str, data: bytes) -> str:
    """The ETag huggingface.co sends: the LFS sha256 for weights, the git blob sha1 otherwise."""
    if name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def repo_folder(cache: Path, repo_id: str) -> Path:
    """``<cache>/models--org--name``."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def write_hub_cache(cache: Path, repo_id: str, files: Mapping[str, bytes], commit: str = COMMIT) -> Path:
    """Write ``files`` into ``cache`` as ``huggingface_hub`` lays them out; return the snapshot folder."""
    repo = repo_folder(cache, repo_id)
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hub_etag(name, data)
        blob.write_bytes(data)
        pointer = snapshot / name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


@contextmanager
def served_repo(repo_id: str, files: Mapping[str, bytes], commit: str = COMMIT) -> Iterator[str]:
    """A Hub endpoint on ``127.0.0.1`` serving ``files`` of ``repo_id`` at ``commit``; yields its URL.

    The server is :func:`tests.helpers.hub_server.served_hub` (which also counts what it serves).
    """
    from tests.helpers.hub_server import served_hub

    with served_hub(repo_id, files, commit) as hub:
        yield hub.endpoint


def download_with_huggingface_hub(cache: Path, repo_id: str, files: Mapping[str, bytes],
                                  commit: str = COMMIT) -> Path:
    """``hf_hub_download`` every file into ``cache`` from a local Hub; return the snapshot folder."""
    from huggingface_hub import hf_hub_download

    snapshot = None
    with served_repo(repo_id, files, commit) as endpoint:
        for name in files:
            pointer = hf_hub_download(repo_id, name, revision="main", cache_dir=cache, endpoint=endpoint,
                                      token=False)
            if "/" not in name:
                snapshot = Path(pointer).parent
    assert snapshot is not None, "at least one top-level file is needed"
    return snapshot


def cache_tree(repo: Path) -> dict[str, str]:
    """Every entry under ``repo`` (caches' lock and tag files aside): link target, file contents' hash or dir."""
    tree: dict[str, str] = {}
    for root, dirs, names in os.walk(repo):
        for name in [*dirs, *names]:
            path = Path(root) / name
            rel = str(path.relative_to(repo))
            if path.is_symlink():
                tree[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                tree[rel] = "dir"
            else:
                tree[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return tree
