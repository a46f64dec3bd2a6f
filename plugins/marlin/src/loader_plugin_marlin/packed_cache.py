"""The packed-weights bundle of a GPTQ, AWQ or compressed-tensors load: which one, and what keys its units.

The core keeps the bundle (:class:`loader.kernels.PackedBundle`: the file, its identity checks, atomic writes,
least-recently-used pruning, the copy-on-write map whose views become the layers' buffers); this module says
what is this plugin's about it:

- one bundle per set of checkpoint files and per variant (tensor parallel rank and size), under
  ``<cache root>/marlin-packed/`` (:func:`loader.io.cache_root`), magic :data:`MAGIC`; only for loads on the CPU;
- its salt: every module of this plugin (the formats, the kernels and their choice decide the bytes) and the
  core's packing code (:func:`loader.kernels.packing_salt`);
- a unit is one weight's kernel (:mod:`.kernel_records`), keyed by :func:`unit_key`: the method, the config
  (bits, group size, act-order, symmetry, the kernel asked for, the format's own fields), the weight's geometry
  and dtype, and each checkpoint tensor part it was given — the whole tensor's file, offset, size, dtype and
  shape, and the rows, columns and expert this rank took of it — or, for the small tensors read while loading
  (``g_idx``, shape records, per-tensor scales), a digest of their values.

So a second load of the same files with the same options maps the kernels' tensors the first load packed and
never reads the checkpoint's quantized tensors (:mod:`.deferred_parts`); a changed file (size, inode, times), a
changed config or option, another rank or size, another torch or CPU, or edited packing code misses. A live
weight update never looks the bundle up or stores in it: it repacks from the tensors it is given into the
layer's buffers (copy-on-write pages when they are the bundle's; the file is never written through them).
Off with ``LOADER_MARLIN_PACKED_CACHE=0``; ``LOADER_MARLIN_CACHE_MAX_BYTES`` bounds the bundles on disk.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import torch

from loader.io import cache_root
from loader.kernels import LoadBundle, PackedBundle, packing_salt
from loader.models import current_session

from .settings import CACHE_MAX_BYTES, PACKED_CACHE

if TYPE_CHECKING:
    from loader.layers import NarrowedPart

__all__ = ["FORMAT", "MAGIC", "PackedCacheSlot", "cache_folder", "new_load_cache", "part_identity", "unit_key"]

FORMAT = 1
MAGIC = b"LDRMRPK\x01"
_SALT: dict[str, Any] | None = None


def cache_folder() -> Path:
    """``<cache root>/marlin-packed``."""
    return cache_root() / "marlin-packed"


def _salt() -> dict[str, Any]:
    """This plugin's modules and the core's packing code (computed once a process)."""
    global _SALT
    if _SALT is None:
        here = Path(__file__).resolve().parent
        _SALT = packing_salt(sorted(here.glob("*.py")), format=FORMAT)
    return _SALT


def _open_bundle(files: tuple[str, ...]) -> PackedBundle | None:
    """The bundle of a load of ``files`` in the load's session (per TP rank and size); ``None`` off the CPU."""
    session = current_session()
    if session.device.type != "cpu":
        return None
    variant = {"tp_rank": session.tp_rank, "tp_size": session.tp_size}
    return PackedBundle(cache_folder(), files, variant, _salt, max_bytes=CACHE_MAX_BYTES.read(), magic=MAGIC,
                        kind="packed marlin")


@attrs.define(eq=False)
class PackedCacheSlot:
    """Where a config finds its load's :class:`~loader.kernels.LoadBundle` (``None``: the bundle is not used);
    every config of a load shares one (a compressed-tensors checkpoint's groups each have a config)."""

    load: LoadBundle | None = None

    def open(self) -> PackedBundle | None:
        return None if self.load is None else self.load.open()

    def describe(self) -> dict[str, Any] | None:
        return None if self.load is None else self.load.describe()


def new_load_cache(files: Sequence[str]) -> LoadBundle | None:
    """The bundle of a load of ``files``, ``None`` when ``LOADER_MARLIN_PACKED_CACHE`` turns it off (a bad
    value of it or of ``LOADER_MARLIN_CACHE_MAX_BYTES`` is refused here, before anything is loaded)."""
    if not PACKED_CACHE.read() or not files:
        return None
    CACHE_MAX_BYTES.read()
    return LoadBundle(functools.partial(_open_bundle, tuple(files)))


def part_identity(part: NarrowedPart, files: frozenset[str]) -> list[object] | None:
    """What decides one landed part's bytes: the whole checkpoint tensor's file, offset, size, dtype and shape,
    and the rows, columns, destination and expert this rank took; ``None`` when the whole tensor is not one run
    of bytes of the load's files (it is then never cached)."""
    span = part.whole.file_span()
    if span is None or (span.path not in files and str(Path(span.path).resolve()) not in files):
        return None
    return [span.path, span.offset, span.nbytes, str(part.whole.dtype).removeprefix("torch."),
            list(part.whole.shape), str(part.shard_id), part.rows, part.cols, part.offset, part.size, part.expert]


def values_digest(tensor: torch.Tensor) -> str:
    """A digest of a small tensor read while loading (``g_idx``, a shape record, per-tensor scales)."""
    data = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def unit_key(what: Mapping[str, object], parts: Mapping[str, Sequence[NarrowedPart]],
             values: Mapping[str, torch.Tensor], files: frozenset[str]) -> str | None:
    """One weight's key: ``what`` (method, config, geometry, dtype: their reprs), each deferred tensor's
    parts (:func:`part_identity`) and each read tensor's :func:`values_digest`; ``None`` when a part is not
    of the load's files."""
    landed: dict[str, list[list[object]]] = {}
    for name, name_parts in sorted(parts.items()):
        identities = [part_identity(part, files) for part in name_parts]
        if not identities:
            return None
        landed[name] = []
        for identity in identities:
            if identity is None:
                return None
            landed[name].append(identity)
    digests = {name: values_digest(tensor) for name, tensor in sorted(values.items())}
    return json.dumps([dict(what), landed, digests], sort_keys=True, separators=(",", ":"))
