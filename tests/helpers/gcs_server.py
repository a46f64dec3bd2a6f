"""A GCS emulator for tests: ``gcp-storage-emulator`` (PyPI) on 127.0.0.1, in this process, in memory.

:func:`gcs_environment` gives the variables that point both the plugin's Google
client (``STORAGE_EMULATOR_HOST``) and the streamer's GCS backend
(``CLOUD_STORAGE_EMULATOR_ENDPOINT``) at it. The emulator checks no credentials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.helpers.s3_server import free_port

__all__ = ["GcsEmulator", "gcs_environment", "upload_folder_gcs"]


def gcs_environment(endpoint: str) -> dict[str, str]:
    return {"STORAGE_EMULATOR_HOST": endpoint, "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint}


class GcsEmulator:
    """The emulator's HTTP server on a free port; :meth:`client` uploads and replaces objects."""

    def __init__(self) -> None:
        from gcp_storage_emulator.server import create_server

        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._server = create_server("127.0.0.1", self.port, in_memory=True)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()

    def client(self) -> Any:
        import os

        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        os.environ["STORAGE_EMULATOR_HOST"] = self.endpoint  # the client reads it when built
        return storage.Client(project="test", credentials=AnonymousCredentials())


def upload_folder_gcs(client: Any, folder: Path, bucket: str, prefix: str) -> None:
    """Every file directly in ``folder`` as ``gs://bucket/prefix/<name>``."""
    target = client.bucket(bucket)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            target.blob(f"{prefix}/{path.name}").upload_from_filename(str(path))
