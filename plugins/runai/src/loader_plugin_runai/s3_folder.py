"""An ``s3://`` prefix seen as a checkpoint folder: its files by name, and small files as bytes.

This is the shape the core's ``Source`` is growing (list the files, read a
small one as bytes), kept here so the rest of the plugin does not care
whether it talks to S3 or to a local folder. The listing is taken once and
kept: the identity check at the end of a load compares against it.
"""

from __future__ import annotations

import json
from typing import Any

from loader.errors import ConfigError

from .object_store import ObjectInfo, ObjectStore
from .uri import ObjectUri, parse_object_uri

__all__ = ["MAX_SIDE_FILE_BYTES", "S3Folder"]

MAX_SIDE_FILE_BYTES = 64 * 1024 * 1024
"""The largest config, index or tokenizer file fetched (the core's limit for JSON files)."""


class S3Folder:
    """The objects directly under one prefix."""

    def __init__(self, location: str | ObjectUri, store: ObjectStore | None = None) -> None:
        self.uri = location if isinstance(location, ObjectUri) else parse_object_uri(location)
        self.store = store if store is not None else ObjectStore(self.uri)
        self._listing: dict[str, ObjectInfo] | None = None

    def __str__(self) -> str:
        return str(self.uri)

    def listing(self) -> dict[str, ObjectInfo]:
        """Name -> object, listed on first use (raises if the bucket or prefix does not exist)."""
        if self._listing is None:
            self._listing = self.store.list_folder()
        return self._listing

    def names(self) -> list[str]:
        return sorted(self.listing())

    def has(self, name: str) -> bool:
        return name in self.listing()

    def read_bytes(self, name: str, max_bytes: int = MAX_SIDE_FILE_BYTES) -> bytes:
        """All of a small file."""
        return self.store.read(name, max_bytes)

    def read_json_object(self, name: str, what: str) -> dict[str, Any]:
        """A JSON object file; anything else is a :class:`ConfigError` naming the object."""
        where = self.uri.join(name)
        raw = self.read_bytes(name)
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{where}: {what} is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {what} is not valid JSON ({exc.msg} at line {exc.lineno})") from exc
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{where}: {what} is not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: {what} must be a JSON object, found {type(data).__name__}")
        return data
