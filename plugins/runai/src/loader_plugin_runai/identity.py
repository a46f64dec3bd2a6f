"""Whether the files a load streams are still the ones it listed.

The streamer reads an object's header, then its tensor ranges, in separate
requests; an object replaced or truncated in between would otherwise load
as a mix of two checkpoints, or as garbage of the right size. The load
records each file's identity when it lists them (an object's size and ETag,
a local file's size and modification time) and checks them again once every
tensor has been streamed — and when the streamer fails, to say why. A change
after that check cannot affect bytes already read.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import attrs

from loader.errors import SourceNotFoundError

from .errors import ObjectChangedError
from .object_store import ObjectInfo
from .stores import Store, open_store
from .uri import ObjectUri

__all__ = ["FileIdentity", "Snapshot", "local_snapshot", "object_snapshot"]


@attrs.frozen
class FileIdentity:
    """What a file was when listed: its size and a version tag (ETag, or mtime in nanoseconds)."""

    size: int
    version: str


@attrs.frozen
class Snapshot:
    """The identities of the files of one stream, and where to ask for them again."""

    files: Mapping[str, FileIdentity]
    uri: ObjectUri | None = None
    """The prefix the files are under, for ``s3://`` snapshots; ``None`` for local files."""
    store: Store | None = attrs.field(default=None, eq=False, repr=False)
    """The client that listed the prefix, asked again by :meth:`verify` and used to read headers:
    one client per prefix for the whole load, not one per check."""

    def only(self, files: Iterable[str]) -> Snapshot:
        """The snapshot of ``files`` alone (those the core kept after filtering)."""
        kept = set(files)
        return Snapshot({f: i for f, i in self.files.items() if f in kept}, self.uri, self.store)

    def current(self, file: str, store: Store | None) -> FileIdentity | None:
        """The file's identity now, or ``None`` if it is gone."""
        if store is None:
            try:
                stat = os.stat(file)
            except OSError:
                return None
            return FileIdentity(stat.st_size, str(stat.st_mtime_ns))

        assert self.uri is not None
        try:
            info = store.head(file[len(self.uri.join("")):])
        except SourceNotFoundError:
            return None
        return FileIdentity(info.size, info.etag)

    def verify(self) -> None:
        """Raise :class:`ObjectChangedError` naming the first file that changed since it was listed."""
        store = self.store
        if self.uri is not None and store is None:
            store = open_store(self.uri)
        for file, was in self.files.items():
            now = self.current(file, store)
            if now is None:
                raise ObjectChangedError(f"{file}: removed while the load was reading it")
            if now.size != was.size:
                raise ObjectChangedError(
                    f"{file}: changed while the load was reading it (size {was.size} -> {now.size} bytes); "
                    "nothing was loaded, try again once the upload is complete"
                )
            if now.version != was.version:
                raise ObjectChangedError(
                    f"{file}: replaced while the load was reading it (version {was.version} -> {now.version}); "
                    "nothing was loaded, try again once the upload is complete"
                )


def object_snapshot(store: Store, listing: Mapping[str, ObjectInfo], names: list[str]) -> Snapshot:
    """The snapshot of ``names`` (under the store's prefix) from the listing ``store`` took."""
    uri = store.uri
    return Snapshot({uri.join(n): FileIdentity(listing[n].size, listing[n].etag) for n in names}, uri, store)


def local_snapshot(paths: list[str]) -> Snapshot:
    """The snapshot of local files, taken now."""
    files = {}
    for path in paths:
        stat = os.stat(path)
        files[path] = FileIdentity(stat.st_size, str(stat.st_mtime_ns))
    return Snapshot(files)
