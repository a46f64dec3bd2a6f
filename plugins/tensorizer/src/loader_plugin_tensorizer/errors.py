"""The errors this plugin adds to the core's; each is a :class:`~loader.errors.LoadError`, so the CLI
prints it on one line and ``load_model`` callers catch one type."""

from __future__ import annotations

from loader.errors import LoadError

__all__ = ["DecryptionError", "StorageAccessError"]


class StorageAccessError(LoadError):
    """The object store or HTTP server could not be reached, refused the request or has no such file."""


class DecryptionError(LoadError):
    """An encrypted file and its key disagree: no key given, a key for another file, or a key for a plain file."""
