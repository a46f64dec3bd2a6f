"""GGUF's packed-weights bundles: which one a load uses, what keys its units, and the options that turn it off.

The core keeps the bundle (:class:`loader.kernels.PackedBundle`: the file, its identity checks, atomic
writes, least-recently-used pruning, the copy-on-write map whose views become the layers' buffers); this
module says what is GGUF about it:

- one bundle per set of GGUF files and per variant (tensor parallel rank and size, kernel and dense dtypes),
  under ``<cache root>/gguf-packed/`` (:func:`loader.io.cache_root`: ``$LOADER_CACHE_DIR`` or the user cache
  folder), magic :data:`MAGIC`;
- its salt (:func:`_salt`): this plugin's packing code (the modules whose code decides packed bytes or their
  keys: :func:`packing_code`) and the core's;
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
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from loader.io import cache_root
from loader.kernels import PackedBundle, packing_salt
from loader.models import current_session

from ..settings import CACHE_MAX_BYTES, PACKED_CACHE
from .options import yes_no_option
from .q4_blocks import gguf_window

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions
    from loader.weights import CheckpointTensor

__all__ = ["DEFAULT_MAX_BYTES", "FORMAT", "MAGIC", "cache_folder", "cache_requested", "open_bundle", "open_load_bundle",
           "packing_code", "unit_key"]

FORMAT = 1
MAGIC = b"LDRGGPK\x01"
DEFAULT_MAX_BYTES = CACHE_MAX_BYTES.default
"""What the bundles together may take on disk before the least recently used are removed (8 GiB)."""
_FORMAT_CODE = ("dequantize.py", "kernels_kquants.py", "kernels_legacy.py", "tensors.py")
"""The format's modules whose code decides packed bytes (the block decoders, the windows that key units)."""


def cache_requested(options: LoadOptions) -> bool:
    """Whether a load uses the cache: ``format_options`` ``packed_cache`` when given, else
    ``LOADER_GGUF_PACKED_CACHE`` (default on). Bad values, and a bad ``LOADER_GGUF_CACHE_MAX_BYTES`` when the
    cache is on, are refused here, before anything is loaded (a variable's as :class:`loader.errors.SettingError`)."""
    wanted = yes_no_option(options, "packed_cache")
    if wanted is None:
        wanted = PACKED_CACHE.read()
    if not wanted:
        return False
    _max_bytes()
    return True


def cache_folder() -> Path:
    """``<cache root>/gguf-packed``."""
    return cache_root() / "gguf-packed"


def _max_bytes() -> int:
    return CACHE_MAX_BYTES.read()


_SALT: dict[str, Any] | None = None
_SALT_LOCK = threading.Lock()


def packing_code() -> list[Path]:
    """The source files whose code decides packed bytes or their keys: every module of this package and the
    format's block decoders and windows (:data:`_FORMAT_CODE`)."""
    here = Path(__file__).resolve().parent
    return [*sorted(here.glob("*.py")), *(here.parent / "format" / name for name in _FORMAT_CODE)]


def _salt() -> dict[str, Any]:
    """What decides the packed bytes besides the source (:func:`loader.kernels.packing_salt`): this plugin's
    packing code (:func:`packing_code`) and the core's. Computed once a process."""
    global _SALT
    with _SALT_LOCK:
        if _SALT is None:
            _SALT = packing_salt(packing_code(), format=FORMAT)
        return _SALT


def open_bundle(files: Sequence[str], variant: Mapping[str, Any]) -> PackedBundle:
    """The bundle of a load of ``files`` with ``variant``: opened (and its file read) on the first lookup."""
    return PackedBundle(cache_folder(), files, variant, _salt, max_bytes=_max_bytes(), magic=MAGIC,
                        kind="packed GGUF")


def open_load_bundle(files: tuple[str, ...], kernel_dtype: str | None, dense_dtype: str | None) -> PackedBundle:
    """A load's bundle, made in its session (:class:`loader.kernels.LoadBundle`'s opener): the variant is the
    tensor parallel rank and size and the load's kernel and dense dtypes."""
    session = current_session()
    return open_bundle(files, {"tp_rank": session.tp_rank, "tp_size": session.tp_size,
                               "kernel_dtype": kernel_dtype, "dense_dtype": dense_dtype})


def unit_key(kind: str, dtype: torch.dtype, tensors: Sequence[CheckpointTensor], files: Sequence[str],
             **extra: object) -> str | None:
    """What decides one packing call's bytes, spelled out: ``kind`` (the kernel), the kernel ``dtype``, each
    part's GGUF window (file, data offset, block type, stored shape, rows and columns kept, the digest of its
    row order) and ``extra``; ``None`` when a part is not a GGUF window of one of ``files`` (the files whose
    identity names the bundle), so it is never cached."""
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
