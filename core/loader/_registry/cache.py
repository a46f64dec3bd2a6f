"""The on-disk cache of probed model info, one small JSON file per key.

Lives under ``platformdirs.user_cache_dir("loader")/model-info`` (the
``LOADER_CACHE_DIR`` environment variable replaces the base folder). Each
result is written to a temporary file in the same folder and moved into place
with ``os.replace``, so a reader sees either no file or a whole one, and two
processes probing at once both leave a valid file (the last one wins; they
hold the same answer). A file that cannot be parsed or does not match its key
is ignored, and the next store rewrites it. The cache is an optimisation: a
folder that cannot be written only costs a probe next time. What was ignored
or not written is in :attr:`ProbeCache.notes`, and a folder that cannot be
written is warned about once per process (:func:`loader._cache_root.warn_cache_not_written`).

An entry also records the source fingerprint of every package in the class's
MRO (a base class from another plugin); a changed one makes the entry stale.
Storing an architecture's entry removes its other, stale entries, so the
folder holds one file per architecture instead of one per edit ever made.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from .._atomic_file import replaced_atomically
from .._cache_root import cache_root, warn_cache_not_written
from .capabilities import ModelInfo, ModelInfoError
from .entry import RegisteredModel
from .fingerprint import source_fingerprint

__all__ = ["CACHE_FORMAT", "ProbeCache", "default_cache_dir"]

CACHE_FORMAT = 2
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
log = logging.getLogger(__name__)


def default_cache_dir() -> Path:
    """``$LOADER_CACHE_DIR/model-info``, else the platform's user cache folder for ``loader``."""
    return cache_root() / "model-info"


@attrs.frozen
class ProbeCache:
    """Read and write probe results in ``directory``."""

    directory: Path = attrs.field(factory=default_cache_dir)
    notes: list[str] = attrs.field(factory=list, eq=False, repr=False)
    """Entries found but not used (damaged, for another key, stale) and entries not written, with why."""

    def path_for(self, entry: RegisteredModel, key: str) -> Path:
        return self.directory / f"{_safe_name(entry)}-{key[:40]}.json"

    def load(self, entry: RegisteredModel, key: str,
             fingerprint: Callable[[str], str | None] = source_fingerprint) -> ModelInfo | None:
        """The cached info, or ``None`` if absent, unreadable, corrupt, for another key, or stale.

        ``fingerprint`` gives a package's source digest (a caller checking many entries passes a
        memoized one, so each package's files are walked once).
        """
        path = self.path_for(entry, key)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return None
        try:
            data = json.loads(text)
            if (
                not isinstance(data, dict)
                or data.get("format") != CACHE_FORMAT
                or data.get("key") != key
                or data.get("class_path") != entry.class_path
            ):
                raise ModelInfoError("written for another key or format")
            info = ModelInfo.from_json(data.get("info"))
            stored = data.get("packages", {})
            if not isinstance(stored, dict):
                raise ModelInfoError("packages must be an object")
        except (ValueError, TypeError) as exc:  # json.JSONDecodeError and ModelInfoError are ValueErrors
            self._ignored(path, str(exc))
            return None
        if info.architecture != entry.architecture:
            self._ignored(path, f"written for architecture {info.architecture!r}")
            return None
        if any(fingerprint(package) != digest for package, digest in stored.items()):
            self._ignored(path, "stale: a package of the class's MRO changed")
            return None
        return info

    def _ignored(self, path: Path, why: str) -> None:
        self.notes.append(f"{path.name} ignored: {why}")
        log.debug("ignoring model-info cache file %s: %s", path, why)

    def store(self, entry: RegisteredModel, key: str, info: ModelInfo, packages: Iterable[str] = (),
              fingerprint: Callable[[str], str | None] = source_fingerprint) -> None:
        """Write atomically (temporary file, then ``os.replace``), then prune; failures are logged, not raised.

        ``packages`` are the top-level packages of the class's MRO; their fingerprints are stored with it.
        """
        path = self.path_for(entry, key)
        digests = {p: digest for p in sorted(set(packages)) if (digest := fingerprint(p)) is not None}
        payload = {"format": CACHE_FORMAT, "key": key, "architecture": entry.architecture,
                   "class_path": entry.class_path, "packages": digests, "info": info.to_json()}
        try:
            with replaced_atomically(path, mode="w", prefix=f".{path.stem}.") as handle:
                json.dump(payload, handle, indent=1, sort_keys=True)
            self._prune(entry, keep=path)
        except OSError as exc:
            self.notes.append(f"{path.name} not written: {exc}")
            warn_cache_not_written(self.directory, exc)

    def _prune(self, entry: RegisteredModel, keep: Path) -> None:
        """Remove ``entry``'s architecture's other entries: written under keys that no longer apply."""
        pattern = re.compile(re.escape(_safe_name(entry)) + r"-[0-9a-f]{40}\.json")
        for other in self.directory.iterdir():
            if other != keep and pattern.fullmatch(other.name):
                with contextlib.suppress(OSError):
                    other.unlink()


def _safe_name(entry: RegisteredModel) -> str:
    return _UNSAFE.sub("_", entry.architecture)[:80]
