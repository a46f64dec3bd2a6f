"""``s3://bucket/prefix`` (and ``gs://bucket/prefix``, ``az://container/prefix``) locations, parsed once and
joined with file names.

The prefix is treated as a folder: ``s3://bucket/models/llama`` and
``s3://bucket/models/llama/`` name the same checkpoint, and its files are the
objects directly under ``models/llama/`` (not deeper: ``original/`` and other
sub-prefixes hold other layouts, as in a local folder).
"""

from __future__ import annotations

import re

import attrs

from loader.errors import SourceNotFoundError

from .formats import SCHEMES, is_object_uri

__all__ = ["SCHEMES", "ObjectUri", "is_object_uri", "parse_object_uri"]


_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")


@attrs.frozen
class ObjectUri:
    """A bucket and a key prefix that ends with ``/`` (or is empty: the bucket's top level)."""

    scheme: str
    bucket: str
    prefix: str

    def __str__(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.prefix}"

    def key(self, name: str) -> str:
        """The object key of ``name`` (a file name relative to the prefix)."""
        return self.prefix + name

    def join(self, name: str) -> str:
        """The full URI of ``name``, as the streamer takes it."""
        return f"{self.scheme}://{self.bucket}/{self.key(name)}"


def parse_object_uri(location: str) -> ObjectUri:
    """Split ``s3://bucket/prefix`` into its parts; a malformed one is a :class:`SourceNotFoundError` naming it."""
    scheme, sep, rest = location.partition("://")
    if not sep or scheme not in SCHEMES:
        raise SourceNotFoundError(f"{location}: expected {' or '.join(s + '://' for s in SCHEMES)}bucket/prefix")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.match(bucket):
        raise SourceNotFoundError(
            f"{location}: {bucket!r} is not a valid bucket name (3-63 lowercase letters, digits, '.' or '-')"
        )
    prefix = prefix.strip("/")
    if ".." in prefix.split("/"):
        raise SourceNotFoundError(f"{location}: the prefix may not contain '..'")
    return ObjectUri(scheme=scheme, bucket=bucket, prefix=f"{prefix}/" if prefix else "")
