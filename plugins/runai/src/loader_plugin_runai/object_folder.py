"""An object-store prefix as a checkpoint folder: the core's :class:`~loader.checkpoint.SourceReader` for
``s3://``, ``gs://`` and ``az://``.

The core lists a remote source's files and reads its small ones
(``config.json``, the index, the tokenizer files) through the reader its
:class:`~loader.checkpoint.Source` carries, and applies the index and the
training-artifact rules itself. The listing is taken once and kept: format
detection and the end-of-load identity check compare against it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .object_store import ObjectInfo
from .stores import Store, open_store
from .uri import ObjectUri, parse_object_uri

__all__ = ["ObjectFolder", "S3Folder"]


class ObjectFolder:
    """The objects directly under one prefix (sub-prefixes such as ``original/`` are not listed)."""

    def __init__(self, location: str | ObjectUri, store: Store | None = None) -> None:
        self.uri = location if isinstance(location, ObjectUri) else parse_object_uri(location)
        self.store = store if store is not None else open_store(self.uri)
        self._listing: dict[str, ObjectInfo] | None = None

    def __str__(self) -> str:
        return str(self.uri)

    def listing(self) -> dict[str, ObjectInfo]:
        """Name -> object, listed on first use (raises if the bucket or prefix does not exist)."""
        if self._listing is None:
            self._listing = self.store.list_folder()
        return self._listing

    def list_files(self) -> Sequence[str]:
        """Every file directly under the prefix, by name (``SourceReader``)."""
        return sorted(self.listing())

    def has(self, name: str) -> bool:
        return name in self.listing()

    def read_bytes(self, name: str, limit: int) -> bytes | None:
        """The object's bytes, at most ``limit + 1`` of them; ``None`` if there is no such object (``SourceReader``)."""
        if "/" not in name and not self.has(name):
            return None
        return self.store.read_head(name, limit + 1)


S3Folder = ObjectFolder
"""The name this reader had when it read ``s3://`` only."""
