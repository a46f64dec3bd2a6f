"""The small-object side of a ``gs://`` checkpoint, through ``google-cloud-storage``.

The same four requests as :mod:`.object_store` makes on S3 (list a prefix, read the
head of a side file, read a header range, ask an object's version again), with the
Google client that ``runai-model-streamer-gcs`` installs; tensor bytes go through
the streamer's GCS backend. Credentials come from Application Default Credentials
(``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server, ``gcloud``). With
``STORAGE_EMULATOR_HOST`` set (a local emulator) both clients talk to it without
credentials (:func:`emulator_endpoint`; the streamer's backend reads it as
``CLOUD_STORAGE_EMULATOR_ENDPOINT``, which :mod:`.settings` sets to match). An
object's version is its generation, which every upload changes.
"""

from __future__ import annotations

import os
from typing import Any

from loader.errors import SourceNotFoundError

from .errors import StorageAccessError
from .object_store import ObjectInfo, call_translating
from .uri import ObjectUri

__all__ = ["GcsStore", "emulator_endpoint"]

_TIMEOUT = (5, 30)
"""Seconds to connect, then to wait for a reply: a server that is gone fails the load in seconds."""


def emulator_endpoint() -> str | None:
    """The GCS emulator ``STORAGE_EMULATOR_HOST`` names (with a scheme), or ``None`` for Google itself."""
    host = os.environ.get("STORAGE_EMULATOR_HOST") or None
    if host is not None and "://" not in host:
        host = f"http://{host}"
    return host


def _client() -> Any:
    from google.cloud import storage

    if emulator_endpoint() is not None:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project="loader", credentials=AnonymousCredentials())
    return storage.Client()


class GcsStore:
    """Requests against one bucket and prefix of Google Cloud Storage; each error names the object."""

    def __init__(self, uri: ObjectUri, client: Any = None) -> None:
        self.uri = uri
        self._client = client if client is not None else _client()

    def _failed(self, exc: Exception, name: str | None) -> Exception:
        """The :class:`~loader.errors.LoadError` for a client failure on ``name`` (or on the prefix)."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        where = self.uri.join(name) if name is not None else str(self.uri)
        if isinstance(exc, api.NotFound):
            if name is None or "bucket" in str(exc).lower():
                return SourceNotFoundError(f"{where}: bucket {self.uri.bucket!r} does not exist")
            return SourceNotFoundError(f"{where}: no such object")
        if isinstance(exc, (api.Forbidden, api.Unauthorized, auth.DefaultCredentialsError, auth.RefreshError)):
            return StorageAccessError(f"{where}: the server refused the credentials ({_reason(exc)})")
        if isinstance(exc, api.GoogleAPICallError):
            return StorageAccessError(f"{where}: the server answered {_reason(exc)}")
        if isinstance(exc, (OSError, auth.TransportError)) or type(exc).__module__.startswith("requests"):
            server = emulator_endpoint() or "storage.googleapis.com"
            return StorageAccessError(f"{where}: cannot reach {server}: {_reason(exc)}")
        return exc

    def _call(self, name: str | None, request: Any) -> Any:
        return call_translating(self._failed, name, request)

    def list_folder(self) -> dict[str, ObjectInfo]:
        """The objects directly under the prefix, by name (sub-prefixes are not entered)."""
        def listing() -> dict[str, ObjectInfo]:
            found = {}
            blobs = self._client.list_blobs(self.uri.bucket, prefix=self.uri.prefix, delimiter="/",
                                            timeout=_TIMEOUT, retry=None)
            for blob in blobs:
                name = blob.name[len(self.uri.prefix):]
                if name:
                    found[name] = ObjectInfo(name, int(blob.size or 0), str(blob.generation))
            return found

        found = self._call(None, listing)
        if not found:
            raise SourceNotFoundError(f"{self.uri}: no objects under this prefix")
        return found

    def head(self, name: str) -> ObjectInfo:
        """Size and generation of ``name`` now."""
        def ask() -> ObjectInfo:
            blob = self._client.bucket(self.uri.bucket).get_blob(self.uri.key(name), timeout=_TIMEOUT, retry=None)
            if blob is None:
                raise SourceNotFoundError(f"{self.uri.join(name)}: no such object")
            return ObjectInfo(name, int(blob.size or 0), str(blob.generation))

        return self._call(name, ask)  # type: ignore[no-any-return]

    def read_head(self, name: str, max_bytes: int) -> bytes | None:
        """The first ``max_bytes`` bytes of ``name`` (all of a smaller object); ``None`` if it does not exist."""
        from google.api_core import exceptions as api

        try:
            return self._download(name, 0, max(max_bytes, 1))
        except SourceNotFoundError:
            return None
        except StorageAccessError as exc:
            if isinstance(exc.__cause__, api.RequestRangeNotSatisfiable):  # an empty object
                return b""
            raise

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start`` (fewer if the object ends first)."""
        return self._download(name, start, length) if length > 0 else b""

    def _download(self, name: str, start: int, length: int) -> bytes:
        blob = self._client.bucket(self.uri.bucket).blob(self.uri.key(name))
        return self._call(name, lambda: bytes(blob.download_as_bytes(  # type: ignore[no-any-return]
            start=start, end=start + length - 1, timeout=_TIMEOUT, retry=None, checksum=None)))


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
