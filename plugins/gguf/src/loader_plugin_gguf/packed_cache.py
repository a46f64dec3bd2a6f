"""GGUF's packed-weights bundles: which one a load uses, what keys its units, and the options that turn it off.

The core keeps the bundle (:class:`loader.kernels.PackedBundle`: the file, its identity checks, atomic
writes, least-recently-used pruning, the copy-on-write map whose views become the layers' buffers); this
module says what is GGUF about it:

- one bundle per set of GGUF files and per variant (tensor parallel rank and size, kernel and dense dtypes),
  under ``<cache root>/gguf-packed/`` (:func:`loader.io.cache_root`: ``$LOADER_CACHE_DIR`` or the user cache
  folder), magic :data:`MAGIC`;
- its salt (:func:`_salt`): this plugin's packing code, the source files whose code decides packed bytes,
  and the core's;
- a unit's key (:func:`unit_key`): everything that decides one packing call's bytes, spelled out — the parts'
  files, offsets, block types, windows and row orders, the kernel and its dtype.

A later load of the same file maps the bytes the first one packed instead of packing them into fresh memory
again. Off with ``format_options={"packed_cache": False}`` (CLI ``--format-option packed_cache=false``) or
``LOADER_GGUF_PACKED_CACHE=0``; ``LOADER_GGUF_CACHE_MAX_BYTES`` bounds what the bundles take on disk together
(:data:`DEFAULT_MAX_BYTES`). A bundle never fails a load: what went wrong is in the load report.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loader.kernels import PackedBundle, packing_salt

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions
    from loader.weights import CheckpointTensor

__all__ = ["DEFAULT_MAX_BYTES", "FORMAT", "MAGIC", "cache_folder", "cache_requested", "open_bundle", "unit_key"]

FORMAT = 1
MAGIC = b"LDRGGPK\x01"
DEFAULT_MAX_BYTES = 8 << 30
"""What the bundles together may take on disk before the least recently used are removed (8 GiB)."""
PACKING_CODE = ("embedding.py", "half_split.py", "kernels_kquants.py", "kernels_legacy.py", "packed_cache.py",
                "packed_linear.py", "q4_blocks.py", "tensors.py")
"""This plugin's modules whose code decides packed bytes (or their keys): the salt digests them."""


def cache_requested(options: LoadOptions) -> bool:
    """Whether a load uses the cache: ``format_options`` ``packed_cache`` when given, else
    ``LOADER_GGUF_PACKED_CACHE`` (default on). Bad values, and a bad ``LOADER_GGUF_CACHE_MAX_BYTES`` when the
    cache is on, are refused here, before anything is loaded."""
    from loader.errors import UnsupportedError

    from .packed_linear import _NO, _YES, _format_option

    text = _format_option(options, "packed_cache")
    if text is not None:
        if text not in _YES + _NO:
            raise UnsupportedError(f"format option packed_cache={text!r} is not a yes/no value; use true or false")
    else:
        text = os.environ.get("LOADER_GGUF_PACKED_CACHE", "1").strip().lower()
        if text not in _YES + _NO:
            raise UnsupportedError(f"LOADER_GGUF_PACKED_CACHE={text!r} is not a yes/no value; use 1 or 0")
    if text in _NO:
        return False
    _max_bytes()
    return True


def cache_folder() -> Path:
    """``<cache root>/gguf-packed``."""
    from loader.io import cache_root

    return cache_root() / "gguf-packed"


def _max_bytes() -> int:
    text = os.environ.get("LOADER_GGUF_CACHE_MAX_BYTES")
    if text is None:
        return DEFAULT_MAX_BYTES
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        from loader.errors import UnsupportedError

        raise UnsupportedError(f"LOADER_GGUF_CACHE_MAX_BYTES={text!r} is not a byte count (an integer >= 0)")
    return value


_SALT: dict[str, Any] | None = None
_SALT_LOCK = threading.Lock()


def _salt() -> dict[str, Any]:
    """What decides the packed bytes besides the source (:func:`loader.kernels.packing_salt`): this plugin's
    packing code (:data:`PACKING_CODE`' digest) and the core's. Computed once a process."""
    global _SALT
    with _SALT_LOCK:
        if _SALT is None:
            here = Path(__file__).resolve().parent
            _SALT = packing_salt((here / name for name in PACKING_CODE), format=FORMAT)
        return _SALT


def open_bundle(files: Sequence[str], variant: Mapping[str, Any]) -> PackedBundle:
    """The bundle of a load of ``files`` with ``variant``: opened (and its file read) on the first lookup."""
    return PackedBundle(cache_folder(), files, variant, _salt, max_bytes=_max_bytes(), magic=MAGIC,
                        kind="packed GGUF")


def unit_key(kind: str, dtype: torch.dtype, tensors: Sequence[CheckpointTensor], files: Sequence[str],
             **extra: object) -> str | None:
    """What decides one packing call's bytes, spelled out: ``kind`` (the kernel), the kernel ``dtype``, each
    part's GGUF window (file, data offset, block type, stored shape, rows and columns kept, the digest of its
    row order) and ``extra``; ``None`` when a part is not a GGUF window of one of ``files`` (the files whose
    identity names the bundle), so it is never cached."""
    from .q4_blocks import gguf_window

    parts: list[list[object]] = []
    for tensor in tensors:
        found = gguf_window(tensor)
        if isinstance(found, str) or found[0].file not in files:
            return None
        window, order = found
        digest = None if order is None else hashlib.blake2b(order.contiguous().numpy().tobytes(),
                                                            digest_size=16).hexdigest()
        parts.append([*window.window_key(), digest])
    return json.dumps([kind, str(dtype).removeprefix("torch."), parts, extra], sort_keys=True,
                      separators=(",", ":"))
