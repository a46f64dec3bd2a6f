"""A digest of everything that decides the bytes the core's packers write: the key of packed weights kept on disk."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import torch

from .int4_layout import torch_int4_block_n

__all__ = ["PACKING_SOURCES", "packed_layout_fingerprint"]

PACKING_SOURCES = ("int4_layout.py", "int4_cpu.py", "int8_cpu.py", "native_packing.py", "native_packing.c")
"""The files of this package whose code decides packed bytes (hashed by :func:`packed_layout_fingerprint`)."""


@functools.cache
def packed_layout_fingerprint() -> str:
    """A digest of everything that decides the bytes this core's packers write for a given input: torch's
    version, its int4 row block (:func:`~loader.kernels.int4_layout.torch_int4_block_n`), the CPU capability
    torch dispatches to, and the packing code itself (:data:`PACKING_SOURCES`).

    Why: a plugin that keeps packed weights on disk between loads (:class:`~loader.kernels.PackedBundle`) keys
    them by it, so another torch, another CPU or an edited packer makes a miss instead of loading bytes laid out
    for something else. Computed once a process (the sources are read and hashed).
    """
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for name in PACKING_SOURCES:
        digest.update(name.encode() + b"\0" + (here / name).read_bytes())
    for part in (torch.__version__, str(torch_int4_block_n()), torch.backends.cpu.get_cpu_capability()):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()
