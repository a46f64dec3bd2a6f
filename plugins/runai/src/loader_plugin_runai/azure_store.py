"""The small-object side of an ``az://container/prefix`` checkpoint, through ``azure-storage-blob``.

The same four requests as :mod:`.object_store` makes on S3, with the Azure client
that ``runai-model-streamer-azure`` installs; tensor bytes go through the streamer's
Azure backend. Both read the account from the streamer's variables:
``AZURE_STORAGE_ACCOUNT_NAME`` with ``AZURE_STORAGE_ACCOUNT_KEY``, or
``AZURE_STORAGE_SAS_TOKEN``, or neither (``DefaultAzureCredential``: managed identity,
``az login``), at ``https://<account>.<AZURE_STORAGE_ENDPOINT_SUFFIX>`` (default
``blob.core.windows.net``). ``AZURE_STORAGE_CONNECTION_STRING``, when set, is what
this client uses instead (the streamer's released backend ignores it, so it must name
the same account). An object's version is its ETag.
"""

from __future__ import annotations

import os
from typing import Any

from loader.errors import SourceNotFoundError

from .errors import StorageAccessError
from .object_store import ObjectInfo, call_translating
from .uri import ObjectUri

__all__ = ["AzureStore", "account_url"]

_TIMEOUT: dict[str, Any] = {"connection_timeout": 5, "read_timeout": 30, "retry_total": 0}
"""A server that is gone fails the load in seconds, not after the SDK's minutes of retries."""


def account_url() -> str:
    """``https://<account>.<suffix>``, from the variables the streamer's backend reads."""
    account = os.environ.get("AZURE_STORAGE_ACCOUNT_NAME", "")
    suffix = os.environ.get("AZURE_STORAGE_ENDPOINT_SUFFIX") or "blob.core.windows.net"
    if not account:
        raise StorageAccessError("az:// needs AZURE_STORAGE_ACCOUNT_NAME (the storage account to read from)")
    return f"https://{account}.{suffix}"


def _client() -> Any:
    from azure.storage.blob import BlobServiceClient

    connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    if connection:
        return BlobServiceClient.from_connection_string(connection, **_TIMEOUT)
    url = account_url()
    key = os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
    sas = os.environ.get("AZURE_STORAGE_SAS_TOKEN")
    if key:
        credential: Any = {"account_name": os.environ["AZURE_STORAGE_ACCOUNT_NAME"], "account_key": key}
    elif sas:
        credential = sas.lstrip("?")
    else:
        from azure.identity import DefaultAzureCredential

        credential = DefaultAzureCredential()
    return BlobServiceClient(url, credential=credential, **_TIMEOUT)


class AzureStore:
    """Requests against one container and prefix of Azure Blob Storage; each error names the object."""

    def __init__(self, uri: ObjectUri, client: Any = None) -> None:
        self.uri = uri
        self._service = client if client is not None else _client()
        self._container = self._service.get_container_client(uri.bucket)

    def _failed(self, exc: Exception, name: str | None) -> Exception:
        """The :class:`~loader.errors.LoadError` for a client failure on ``name`` (or on the prefix)."""
        from azure.core import exceptions as az

        where = self.uri.join(name) if name is not None else str(self.uri)
        code = getattr(exc, "error_code", None)
        code = str(getattr(code, "value", code) or "")  # a StorageErrorCode, or the header's string
        if isinstance(exc, az.ResourceNotFoundError):
            if code == "ContainerNotFound" or name is None:
                return SourceNotFoundError(f"{where}: container {self.uri.bucket!r} does not exist")
            return SourceNotFoundError(f"{where}: no such object")
        if isinstance(exc, az.ClientAuthenticationError) or code in ("AuthenticationFailed", "AuthorizationFailure"):
            return StorageAccessError(f"{where}: the server refused the credentials ({code or 'authentication'})")
        if isinstance(exc, az.ServiceRequestError):
            return StorageAccessError(f"{where}: cannot reach {self._service.url}: {_reason(exc)}")
        if isinstance(exc, az.HttpResponseError):
            return StorageAccessError(f"{where}: the server answered {code or exc.status_code}: {_reason(exc)}")
        return exc

    def _call(self, name: str | None, request: Any) -> Any:
        return call_translating(self._failed, name, request)

    def list_folder(self) -> dict[str, ObjectInfo]:
        """The blobs directly under the prefix, by name (virtual sub-folders are not entered)."""
        def listing() -> dict[str, ObjectInfo]:
            found = {}
            for item in self._container.walk_blobs(name_starts_with=self.uri.prefix or None, delimiter="/"):
                name = item.name[len(self.uri.prefix):]
                if name and not name.endswith("/") and hasattr(item, "size"):
                    found[name] = ObjectInfo(name, int(item.size), _etag(item.etag))
            return found

        found = self._call(None, listing)
        if not found:
            raise SourceNotFoundError(f"{self.uri}: no objects under this prefix")
        return found  # type: ignore[no-any-return]

    def head(self, name: str) -> ObjectInfo:
        """Size and ETag of ``name`` now."""
        props = self._call(name, lambda: self._container.get_blob_client(self.uri.key(name)).get_blob_properties())
        return ObjectInfo(name, int(props.size), _etag(props.etag))

    def read_head(self, name: str, max_bytes: int) -> bytes | None:
        """The first ``max_bytes`` bytes of ``name`` (all of a smaller object); ``None`` if it does not exist."""
        try:
            return self._download(name, 0, max(max_bytes, 1))
        except SourceNotFoundError:
            return None

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start`` (fewer if the object ends first)."""
        return self._download(name, start, length) if length > 0 else b""

    def _download(self, name: str, start: int, length: int) -> bytes:
        from azure.core.exceptions import HttpResponseError

        blob = self._container.get_blob_client(self.uri.key(name))
        try:
            return bytes(self._call(name, lambda: blob.download_blob(offset=start, length=length).readall()))
        except StorageAccessError as exc:
            cause = exc.__cause__
            if isinstance(cause, HttpResponseError) and cause.status_code == 416:  # past the end (an empty blob)
                return b""
            raise


def _etag(value: object) -> str:
    """An ETag as the listing spells it (the properties call quotes it)."""
    return str(value).strip('"')


def _reason(exc: Exception) -> str:
    return " ".join(str(exc).split()).split(" RequestId:")[0] or type(exc).__name__
