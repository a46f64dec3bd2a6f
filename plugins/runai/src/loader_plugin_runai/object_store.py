"""The small-object side of an ``s3://`` checkpoint: listing, side files, headers, identity checks.

Tensor bytes go through the Run:ai streamer; everything else is a handful of
small requests made with boto3 (which ``runai-model-streamer-s3`` installs
anyway): list the prefix, fetch ``config.json``, the tokenizer files and the
index, read a safetensors header with ranged GETs, and ask an object's ETag
again after streaming. Credentials, region and endpoint come from the
standard AWS variables and profiles (``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``,
``AWS_ENDPOINT_URL``, ...); with an endpoint set (an S3-compatible server),
requests use path-style addressing. Every failure becomes a
:class:`~loader.errors.LoadError` naming the object and what went wrong.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from loader.errors import SourceNotFoundError

from .errors import StorageAccessError
from .uri import ObjectUri

__all__ = ["ObjectInfo", "ObjectStore", "call_translating", "endpoint_url", "uses_path_style"]

T = TypeVar("T")

_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_REFUSED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken",
            "403", "Forbidden", "AuthorizationHeaderMalformed"}


@attrs.frozen
class ObjectInfo:
    """One object as listed: its name under the prefix, size and ETag (which changes with its content)."""

    name: str
    size: int
    etag: str


def endpoint_url() -> str | None:
    """The S3-compatible endpoint the AWS variables name, or ``None`` for AWS itself."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def uses_path_style() -> bool:
    """Path-style requests (``host/bucket/key``): what S3-compatible servers expect.

    On for any custom endpoint unless ``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=1`` says otherwise
    (the streamer's own switch, so both clients address the server the same way).
    """
    flag = os.environ.get("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING")
    if flag is not None:
        return flag.strip() == "0"
    return endpoint_url() is not None


def _client() -> Any:
    import boto3
    from botocore.config import Config

    config = Config(
        s3={"addressing_style": "path" if uses_path_style() else "auto"},
        # a few quick retries: a stopped server must fail the load in seconds, not minutes
        retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=5, read_timeout=30,
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url(), config=config)


def call_translating(failed: Callable[[Exception, str | None], Exception], name: str | None,
                     request: Callable[[], T]) -> T:
    """``request()``, a client library's failure raised as the :class:`~loader.errors.LoadError` ``failed``
    makes of it (for the object ``name``, or the prefix); a failure it does not know is raised as it is."""
    try:
        return request()
    except Exception as exc:
        translated = failed(exc, name)
        if translated is exc:
            raise
        raise translated from exc


class ObjectStore:
    """Requests against one bucket and prefix; each error names the object and the server's reason."""

    def __init__(self, uri: ObjectUri, client: Any = None) -> None:
        self.uri = uri
        self._client = client if client is not None else _client()

    def _failed(self, exc: Exception, name: str | None) -> Exception:
        """The :class:`~loader.errors.LoadError` for a boto3 failure on ``name`` (or on the prefix)."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        where = self.uri.join(name) if name is not None else str(self.uri)
        if isinstance(exc, NoCredentialsError):
            return StorageAccessError(
                f"{where}: no AWS credentials found (set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
            )
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            message = error.get("Message") or code
            if code == "NoSuchBucket":
                return SourceNotFoundError(f"{where}: bucket {self.uri.bucket!r} does not exist")
            if code in _NOT_FOUND:
                return SourceNotFoundError(f"{where}: no such object")
            if code in _REFUSED:
                return StorageAccessError(f"{where}: the server refused the credentials ({code}: {message})")
            return StorageAccessError(f"{where}: the server answered {code}: {message}")
        if isinstance(exc, BotoCoreError):
            server = endpoint_url() or "S3"
            return StorageAccessError(f"{where}: cannot reach {server}: {exc}")
        return exc

    def list_folder(self) -> dict[str, ObjectInfo]:
        """The objects directly under the prefix, by name; sub-prefixes (``original/``) are not entered.

        :raises SourceNotFoundError: if the bucket does not exist or nothing is under the prefix.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        found: dict[str, ObjectInfo] = {}
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            pages = paginator.paginate(Bucket=self.uri.bucket, Prefix=self.uri.prefix, Delimiter="/")
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(self.uri.prefix):]
                    if name:
                        found[name] = ObjectInfo(name, int(item["Size"]), str(item.get("ETag", "")))
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(exc, None) from exc
        if not found:
            raise SourceNotFoundError(f"{self.uri}: no objects under this prefix")
        return found

    def head(self, name: str) -> ObjectInfo:
        """Size and ETag of ``name`` now."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            reply = self._client.head_object(Bucket=self.uri.bucket, Key=self.uri.key(name))
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(exc, name) from exc
        return ObjectInfo(name, int(reply["ContentLength"]), str(reply.get("ETag", "")))

    def read_head(self, name: str, max_bytes: int) -> bytes | None:
        """The first ``max_bytes`` bytes of ``name`` (all of a smaller object); ``None`` if it does not exist."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            reply = self._client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name),
                                            Range=f"bytes=0-{max(max_bytes, 1) - 1}")
            return bytes(reply["Body"].read())
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in _NOT_FOUND:
                return None
            if code == "InvalidRange":  # an empty object
                return b""
            raise self._failed(exc, name) from exc
        except BotoCoreError as exc:
            raise self._failed(exc, name) from exc

    def read_range(self, name: str, start: int, length: int) -> bytes:
        """``length`` bytes of ``name`` from ``start`` (fewer if the object ends first)."""
        from botocore.exceptions import BotoCoreError, ClientError

        if length <= 0:
            return b""
        try:
            reply = self._client.get_object(Bucket=self.uri.bucket, Key=self.uri.key(name),
                                            Range=f"bytes={start}-{start + length - 1}")
            return bytes(reply["Body"].read())
        except (BotoCoreError, ClientError) as exc:
            raise self._failed(exc, name) from exc
