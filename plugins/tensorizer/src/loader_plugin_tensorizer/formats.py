"""This plugin's format name, file names and URI schemes, in a module of their own so the entry point can
check a location without importing tensorizer, boto3 or torch."""

from __future__ import annotations

import re

__all__ = ["MARKER", "RANK_FILE", "REMOTE_SCHEMES", "SUFFIX", "TENSORIZER", "is_remote", "is_tensors_location",
           "rank_file_name"]

TENSORIZER = "tensorizer"
SUFFIX = ".tensors"
MARKER = "tensorized.json"
"""What ``loader save-tensorized`` writes beside the per-rank files: the TP size they were cut for."""
RANK_FILE = re.compile(r"^model-rank-(\d{3,})\.tensors$")
"""vLLM's per-rank names (``model-rank-%03d.tensors``), which ``save-tensorized`` writes too."""
REMOTE_SCHEMES = ("s3", "http", "https")


def rank_file_name(rank: int) -> str:
    """``model-rank-000.tensors`` for rank 0, as vLLM names them."""
    return f"model-rank-{rank:03d}.tensors"


def is_remote(location: str) -> bool:
    """Whether ``location`` is a URI this plugin reads remotely."""
    return any(location.startswith(f"{scheme}://") for scheme in REMOTE_SCHEMES)


def is_tensors_location(location: str) -> bool:
    """A ``.tensors`` file (or a vLLM-style ``%03d`` pattern of them), local or remote."""
    return location.rstrip("/").endswith(SUFFIX)
