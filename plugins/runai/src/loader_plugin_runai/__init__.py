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
    from .object_store import ObjectInfo, ObjectStore
    from .s3_folder import S3Folder
    from .settings import StreamerSettings
    from .tensor import StreamedSource, StreamedTensor
    from .uri import ObjectUri, parse_object_uri

__all__ = [
    "FORMATS",
    "RUNAI",
    "RUNAI_SHARDED",
    "ObjectChangedError",
    "ObjectInfo",
    "ObjectStore",
    "ObjectUri",
    "S3Folder",
    "StorageAccessError",
    "StreamedSource",
    "StreamedTensor",
    "StreamerSettings",
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
    "S3Folder": ".s3_folder",
    "StreamerSettings": ".settings",
    "StreamedSource": ".tensor",
    "StreamedTensor": ".tensor",
    "ObjectUri": ".uri",
    "parse_object_uri": ".uri",
})
