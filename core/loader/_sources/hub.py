"""Hugging Face Hub ids resolved to a local snapshot folder.

Only the files the chosen format needs are fetched: the first weight pattern
with a match in the repository (safetensors before ``.bin``), plus configs and
tokenizer files; ``original/**`` is never fetched. ``HF_HUB_OFFLINE=1`` makes
this a lookup in the local cache.

When the Hub cannot be reached (no network, a proxy refusing, DNS failing),
a repository already in the local cache is used as it is, with a warning, as
``transformers`` does; otherwise the load fails at once with one line naming
``HF_HUB_OFFLINE``. The file listing is one request with a timeout
(``model_info``), not ``list_repo_files``, which retries a refused connection
for about 25 seconds before giving up.
"""

from __future__ import annotations

import fnmatch
import logging
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
LISTING_TIMEOUT_S = 10.0
log = logging.getLogger(__name__)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _choose_pattern(files: list[str], load_format: str) -> str | None:
    for pattern in WEIGHT_PATTERNS.get(load_format, WEIGHT_PATTERNS["auto"]):
        if any(fnmatch.fnmatch(f, pattern) and not f.startswith("original/") for f in files):
            return pattern
    return None


def is_network_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the Hub could not be reached (rather than answered with an error).

    huggingface_hub raises its HTTP client's transport errors (``ConnectError``, ``ConnectTimeout``, ...)
    as they are; their module is the client's, so they are recognised by class name, not imported.
    """
    names = {klass.__name__ for klass in type(exc).__mro__}
    return bool(names & {"TransportError", "ConnectionError", "TimeoutError"})


def _cached_snapshot(repo_id: str, revision: str | None, patterns: tuple[str, ...]) -> Path:
    import huggingface_hub

    return Path(huggingface_hub.snapshot_download(
        repo_id, revision=revision, local_files_only=True,
        allow_patterns=[*patterns, *SIDE_FILES], ignore_patterns=list(IGNORE),
    ))


def _unreachable(repo_id: str, revision: str | None, patterns: tuple[str, ...], exc: BaseException) -> Path:
    """The cached snapshot when the Hub cannot be reached, else one line saying what to do."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = _cached_snapshot(repo_id, revision, patterns)
    except LocalEntryNotFoundError:
        reason = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise SourceNotFoundError(
            f"{repo_id}: the Hugging Face Hub cannot be reached ({type(exc).__name__}: {reason}) and the "
            "repository is not in the local cache; check the network, or download it first and set "
            "HF_HUB_OFFLINE=1 to work offline"
        ) from exc
    log.warning("%s: the Hugging Face Hub cannot be reached (%s); using the cached snapshot %s",
                repo_id, type(exc).__name__, folder)
    return folder


def download_snapshot(repo_id: str, *, revision: str | None, load_format: str) -> Path:
    """Return the local folder of ``repo_id`` at ``revision`` holding one weight format."""
    import huggingface_hub
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    patterns = WEIGHT_PATTERNS.get(load_format, WEIGHT_PATTERNS["auto"])
    try:
        if _offline():
            return _cached_snapshot(repo_id, revision, patterns)
        try:
            info = huggingface_hub.HfApi().model_info(repo_id, revision=revision, timeout=LISTING_TIMEOUT_S)
        except Exception as exc:
            if is_network_failure(exc):
                return _unreachable(repo_id, revision, patterns, exc)
            raise
        files = [sibling.rfilename for sibling in info.siblings or ()]
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
