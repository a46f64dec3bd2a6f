"""loader plugin: ``s3://`` checkpoints and local streaming through the Run:ai Model Streamer.

Every name is imported on first use (PEP 562): loader imports this package to reach
:mod:`.plugin` in every process that discovers plugins, and a load that streams nothing
should not hold the object store's code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.lazy import lazy_exports

if TYPE_CHECKING:
    from .errors import ObjectChangedError, StorageAccessError
    from .formats import FORMATS, RUNAI, RUNAI_SHARDED
    from .object_folder import ObjectFolder, S3Folder
    from .object_store import ObjectInfo, ObjectStore
    from .settings import StreamerSettings
    from .stores import open_store
    from .tensor import StreamedSource, StreamedTensor
    from .uri import ObjectUri, parse_object_uri

__all__ = [
    "FORMATS",
    "RUNAI",
    "RUNAI_SHARDED",
    "ObjectChangedError",
    "ObjectFolder",
    "ObjectInfo",
    "ObjectStore",
    "ObjectUri",
    "S3Folder",
    "StorageAccessError",
    "StreamedSource",
    "StreamedTensor",
    "StreamerSettings",
    "open_store",
    "parse_object_uri",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "FORMATS": ".formats",
    "RUNAI": ".formats",
    "RUNAI_SHARDED": ".formats",
    "ObjectChangedError": ".errors",
    "StorageAccessError": ".errors",
    "ObjectInfo": ".object_store",
    "ObjectStore": ".object_store",
    "open_store": ".stores",
    "ObjectFolder": ".object_folder",
    "S3Folder": ".object_folder",
    "StreamerSettings": ".settings",
    "StreamedSource": ".tensor",
    "StreamedTensor": ".tensor",
    "ObjectUri": ".uri",
    "parse_object_uri": ".uri",
})
