"""One client per object-store scheme, behind the same four requests.

``s3://`` through boto3 (:mod:`.object_store`), ``gs://`` through google-cloud-storage
(:mod:`.gcs_store`), ``az://`` through azure-storage-blob (:mod:`.azure_store`): each
lists a prefix, reads the head of a small object, reads a byte range and reports an
object's size and version, and names the object and the server's reason when it fails.
Tensor bytes go through the streamer's backend for the same scheme. The Google and
Azure clients come with the streamer's ``runai-model-streamer-gcs`` / ``-azure`` packages
(this plugin's ``gcs`` / ``azure`` extras); a scheme whose package is missing says so.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Protocol

from loader.errors import UnsupportedError

from .object_store import ObjectInfo, ObjectStore
from .uri import ObjectUri

__all__ = ["Store", "open_store"]

_EXTRAS = {"gs": ("runai_model_streamer_gcs", "gcs"), "az": ("runai_model_streamer_azure", "azure")}


class Store(Protocol):
    """What the folder, the header check and the identity check ask of a store."""

    uri: ObjectUri

    def list_folder(self) -> dict[str, ObjectInfo]: ...
    def head(self, name: str) -> ObjectInfo: ...
    def read_head(self, name: str, max_bytes: int) -> bytes | None: ...
    def read_range(self, name: str, start: int, length: int) -> bytes: ...


def open_store(uri: ObjectUri, client: Any = None) -> Store:
    """The store for ``uri``'s scheme (with ``client`` if given, else one built from the environment)."""
    if uri.scheme in _EXTRAS:
        module, extra = _EXTRAS[uri.scheme]
        if importlib.util.find_spec(module) is None:
            raise UnsupportedError(
                f"{uri}: {uri.scheme}:// needs the streamer's {extra} backend: "
                f"pip install 'loader-plugin-runai[{extra}]'"
            )
    if uri.scheme == "gs":
        from .gcs_store import GcsStore

        return GcsStore(uri, client)
    if uri.scheme == "az":
        from .azure_store import AzureStore

        return AzureStore(uri, client)
    return ObjectStore(uri, client)
