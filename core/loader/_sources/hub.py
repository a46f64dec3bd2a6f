"""Hugging Face Hub ids resolved to a local snapshot folder.

Only the files the chosen format needs are fetched: the first weight pattern
with a match in the repository (safetensors before ``.bin``), plus configs and
tokenizer files; ``original/**`` is never fetched. ``HF_HUB_OFFLINE=1`` makes
this a lookup in the local cache.
"""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from ..errors import SourceNotFoundError

__all__ = ["WEIGHT_PATTERNS", "download_snapshot"]

WEIGHT_PATTERNS: dict[str, tuple[str, ...]] = {
    "auto": ("*.safetensors", "*.bin", "*.pt", "*.gguf"),
    "safetensors": ("*.safetensors",),
    "pt": ("*.bin", "*.pt"),
    "gguf": ("*.gguf",),
    "mistral": ("consolidated*.safetensors",),
    "sharded_state": ("model-rank-*.safetensors",),
}
SIDE_FILES = ("*.json", "*.model", "*.txt", "*.jinja", "tokenizer*")
IGNORE = ("original/*", "original/**")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _choose_pattern(files: list[str], load_format: str) -> str | None:
    for pattern in WEIGHT_PATTERNS.get(load_format, WEIGHT_PATTERNS["auto"]):
        if any(fnmatch.fnmatch(f, pattern) and not f.startswith("original/") for f in files):
            return pattern
    return None


def download_snapshot(repo_id: str, *, revision: str | None, load_format: str) -> Path:
    """Return the local folder of ``repo_id`` at ``revision`` holding one weight format."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = WEIGHT_PATTERNS.get(load_format, WEIGHT_PATTERNS["auto"])
    try:
        if _offline():
            folder = huggingface_hub.snapshot_download(
                repo_id, revision=revision, local_files_only=True,
                allow_patterns=[*patterns, *SIDE_FILES], ignore_patterns=list(IGNORE),
            )
            return Path(folder)
        files = huggingface_hub.list_repo_files(repo_id, revision=revision)
        pattern = _choose_pattern(files, load_format)
        if pattern is None:
            raise SourceNotFoundError(f"Hub repository {repo_id!r} has no weight files matching {patterns}")
        folder = huggingface_hub.snapshot_download(
            repo_id, revision=revision, allow_patterns=[pattern, *SIDE_FILES],
            ignore_patterns=list(IGNORE),
        )
        return Path(folder)
    except SourceNotFoundError:
        raise
    except LocalEntryNotFoundError as exc:
        raise SourceNotFoundError(
            f"{repo_id}: not a local path, and not in the Hugging Face cache (HF_HUB_OFFLINE is set)"
        ) from exc
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise SourceNotFoundError(f"{repo_id}: not a local path, and the Hub lookup failed: {exc}") from exc
