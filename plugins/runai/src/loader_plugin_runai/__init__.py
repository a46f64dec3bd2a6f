"""loader plugin: ``s3://`` checkpoints and local streaming through the Run:ai Model Streamer."""

from .detection import FORMATS, RUNAI, RUNAI_SHARDED
from .errors import ObjectChangedError, StorageAccessError
from .object_store import ObjectInfo, ObjectStore
from .s3_folder import S3Folder
from .settings import StreamerSettings
from .tensor import StreamedTensor, StreamSlot
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
    "StreamSlot",
    "StreamedTensor",
    "StreamerSettings",
    "parse_object_uri",
]
