"""loader plugin: CoreWeave tensorizer checkpoints (``.tensors``), read and written.

Every name is imported on first use (PEP 562): loader imports this package to reach
:mod:`.plugin` in every process that discovers plugins.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.lazy import lazy_exports

if TYPE_CHECKING:
    from .errors import DecryptionError, StorageAccessError
    from .formats import MARKER, TENSORIZER, rank_file_name
    from .options import TensorizerOptions
    from .save import SavedTensorized, save_tensorized

__all__ = [
    "MARKER",
    "TENSORIZER",
    "DecryptionError",
    "SavedTensorized",
    "StorageAccessError",
    "TensorizerOptions",
    "rank_file_name",
    "save_tensorized",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "MARKER": ".formats",
    "TENSORIZER": ".formats",
    "rank_file_name": ".formats",
    "DecryptionError": ".errors",
    "StorageAccessError": ".errors",
    "TensorizerOptions": ".options",
    "SavedTensorized": ".save",
    "save_tensorized": ".save",
})
