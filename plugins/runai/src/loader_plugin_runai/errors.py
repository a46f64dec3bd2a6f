"""The errors an object store adds to the core's: access refused, server gone, object changed.

Each is a :class:`~loader.errors.LoadError`, so the CLI prints it on one line
and ``load_model`` callers catch one type.
"""

from __future__ import annotations

from loader.errors import CheckpointFormatError, LoadError

__all__ = ["ObjectChangedError", "StorageAccessError"]


class StorageAccessError(LoadError):
    """The object store refused the credentials, or could not be reached or answered with an error."""


class ObjectChangedError(CheckpointFormatError):
    """An object was replaced or truncated on the server while the load was reading it."""
