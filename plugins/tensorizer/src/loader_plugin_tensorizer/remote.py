"""Ranged reads, streams and listings of ``s3://`` objects (boto3) and ``http(s)://`` files (urllib).

This module reads a file's size and its index (the head of the file), the
side files beside it (``config.json``, the tokenizer), for ``s3://`` the
listing of a prefix, and opens the one stream a plain file's tensors are read
from (an S3 object through a presigned URL, so the bytes go from the socket
straight into the parameters: no boto3 body wrapper, no curl process and
pipe). Every call has short timeouts and one retry, so an unreachable
endpoint fails in seconds with one line that names it, before the
deserializer (encrypted files) would retry for minutes.
"""

from __future__ import annotations

import functools
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlparse

from .errors import StorageAccessError
from .options import TensorizerOptions

__all__ = ["RemoteFile", "list_s3_prefix", "s3_client"]

CONNECT_TIMEOUT_S = 3
READ_TIMEOUT_S = 60


def _endpoint(options: TensorizerOptions) -> str | None:
    return options.s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")


@functools.cache
def _client(endpoint: str | None, key: str | None, secret: str | None) -> Any:
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                    retries={"max_attempts": 2, "mode": "standard"},
                    s3={"addressing_style": "path"} if endpoint else {})
    return boto3.session.Session().client("s3", endpoint_url=endpoint, aws_access_key_id=key,
                                          aws_secret_access_key=secret, config=config)


def _client_with(options: TensorizerOptions, config: Any) -> Any:
    import boto3

    return boto3.session.Session().client("s3", endpoint_url=_endpoint(options), config=config)


def s3_client(options: TensorizerOptions) -> Any:
    """A boto3 client for the endpoint and credentials the options or the environment give."""
    return _client(_endpoint(options), options.s3_access_key_id, options.s3_secret_access_key)


def _split_s3(uri: str) -> tuple[str, str]:
    parsed = urlparse(uri)
    return parsed.netloc, parsed.path.lstrip("/")


def _s3_failure(uri: str, exc: Exception, options: TensorizerOptions) -> StorageAccessError:
    reason = " ".join(str(exc).split()) or type(exc).__name__
    where = _endpoint(options) or "the default S3 endpoint"
    return StorageAccessError(f"{uri}: cannot read from S3 at {where}: {reason}")


def list_s3_prefix(uri: str, options: TensorizerOptions) -> list[str]:
    """The object names directly under the prefix ``uri`` (a folder), relative to it."""
    bucket, prefix = _split_s3(uri.rstrip("/") + "/")
    names: list[str] = []
    try:
        pages = s3_client(options).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix,
                                                                                Delimiter="/")
        for page in pages:
            names.extend(item["Key"][len(prefix):] for item in page.get("Contents", ()))
    except Exception as exc:
        raise _s3_failure(uri, exc, options) from exc
    return names


class RemoteFile:
    """One ``s3://`` or ``http(s)://`` file: its size and ranged reads of it."""

    def __init__(self, uri: str, options: TensorizerOptions) -> None:
        self.uri = uri
        self.options = options
        self.s3 = uri.startswith("s3://")

    def exists(self) -> bool:
        """Whether the file is there (a missing one is ``False``; an unreachable server raises)."""
        try:
            self.size()
        except FileNotFoundError:
            return False
        return True

    @functools.cached_property
    def _size(self) -> int:
        if self.s3:
            bucket, key = _split_s3(self.uri)
            try:
                return int(s3_client(self.options).head_object(Bucket=bucket, Key=key)["ContentLength"])
            except Exception as exc:
                if getattr(exc, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                    raise FileNotFoundError(self.uri) from exc
                raise _s3_failure(self.uri, exc, self.options) from exc
        with self._open("HEAD") as response:
            return int(response.headers["Content-Length"])

    def size(self) -> int:
        """The file's length in bytes; ``FileNotFoundError`` if there is no such file."""
        return self._size

    def _url(self) -> str:
        """An ``http(s)://`` URL of the file: an S3 object's presigned for a GET (unsigned without credentials)."""
        if not self.s3:
            return self.uri
        from botocore import UNSIGNED
        from botocore.config import Config
        from botocore.exceptions import NoCredentialsError

        bucket, key = _split_s3(self.uri)
        client = s3_client(self.options)
        try:
            return str(client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}))
        except NoCredentialsError:
            unsigned = client.meta.config.merge(Config(signature_version=UNSIGNED))
            anonymous = _client_with(self.options, unsigned)
            return str(anonymous.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key}))

    def stream(self) -> Any:
        """The whole file as one GET response (``readinto`` reads it front to back)."""
        return self._open("GET")

    def _open(self, method: str, headers: dict[str, str] | None = None) -> Any:
        request = urllib.request.Request(self._url() if method == "GET" else self.uri, method=method,
                                         headers=headers or {})
        try:
            return urllib.request.urlopen(request, timeout=CONNECT_TIMEOUT_S + READ_TIMEOUT_S)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise FileNotFoundError(self.uri) from exc
            raise StorageAccessError(f"{self.uri}: the server answered HTTP {exc.code} {exc.reason}") from exc
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise StorageAccessError(f"{self.uri}: cannot reach the server: {reason}") from exc

    def read(self, begin: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``begin`` (fewer only where the file ends)."""
        if length <= 0:
            return b""
        end = begin + length - 1
        if self.s3:
            bucket, key = _split_s3(self.uri)
            try:
                body = s3_client(self.options).get_object(Bucket=bucket, Key=key, Range=f"bytes={begin}-{end}")
                return bytes(body["Body"].read())
            except Exception as exc:
                if getattr(exc, "response", {}).get("Error", {}).get("Code") == "InvalidRange":
                    return b""
                raise _s3_failure(self.uri, exc, self.options) from exc
        with self._open("GET", {"Range": f"bytes={begin}-{end}"}) as response:
            data = response.read()
        if response.status == 200:  # a server that ignores ranges sends the whole file
            data = data[begin:begin + length]
        return bytes(data)
