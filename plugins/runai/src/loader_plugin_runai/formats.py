"""This plugin's format names and URI schemes, in a module of their own so the entry point can check
them without importing the readers (:mod:`.detection` pulls in the object store and the snapshot code)
or the URI parser (:mod:`.uri`, an attrs class: tens of KiB held by every process that discovers plugins)."""

from __future__ import annotations

__all__ = ["FORMATS", "RUNAI", "RUNAI_SHARDED", "SCHEMES", "is_object_uri"]

RUNAI = "runai_streamer"
RUNAI_SHARDED = "runai_streamer_sharded"
FORMATS = (RUNAI, RUNAI_SHARDED)

SCHEMES = ("s3", "gs", "az")
"""Schemes this plugin resolves, each through the streamer's backend for it (``gs://`` and ``az://`` with the
``gcs`` / ``azure`` extras); S3-compatible stores (MinIO, moto) work as ``s3://`` with ``AWS_ENDPOINT_URL``."""


def is_object_uri(location: str) -> bool:
    """Whether ``location`` starts with a scheme this plugin resolves."""
    return any(location.startswith(f"{scheme}://") for scheme in SCHEMES)
