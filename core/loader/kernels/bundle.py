"""Packed weights kept on disk, so that a second load maps them instead of packing them again.

Why: packing a layer is cheap byte shuffling, but it writes fresh memory, and a process's first write to a
page costs more than the shuffle; llama.cpp computes on its memory-mapped file, whose pages the page cache
already holds. Once written, packed bytes are such a file too: a later load maps them copy-on-write (touching
a cached file costs a fraction of fresh memory) and the layers' buffers are views of the map. Like OpenVINO's
``CACHE_DIR`` or a compiled-kernel cache, the first load pays (it packs, then writes the bundle), every later
one is cheap. Any quantize method can keep what it packed here; the GGUF and marlin plugins do.

A :class:`PackedBundle` is one load's use of the bundle for a set of source files and a *variant* (whatever
of the load's options changes the packed bytes: tensor parallel rank and size, kernel dtypes). It holds
*units*, each the tensors one packing call made, under a key the method spells out (everything that decides
the unit's bytes). The bundle's file is found by a digest of its identity — the files' identity
(:func:`source_identity`: resolved path, size, inode, modification and change times), the *salt*
(:func:`packing_salt`: the method's packing code and the core's, :func:`~loader.kernels.packed_layout_fingerprint`)
and the variant — and all three are compared again in full when it is opened, so a changed file, another
torch or an edited packer misses instead of loading stale bytes.

Writing: a load that packed anything it did not find writes a new bundle holding every unit it used
(:func:`~loader.kernels.bundle_file.write_bundle`: temporary file, fsync, rename), then removes the least
recently used bundles of its folder beyond ``max_bytes``. A bundle that cannot be read, does not match or
cannot be written is noted (:meth:`PackedBundle.describe`, for the load report; a folder that cannot be
written is also warned about once per process, :func:`loader._cache_root.warn_cache_not_written`) and the load
packs as it would without one: a bundle never fails a load.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .._cache_root import warn_cache_not_written
from .bundle_file import Built, prune, read_bundle, touch, write_bundle
from .fingerprint import packed_layout_fingerprint

__all__ = ["MAGIC", "Built", "PackedBundle", "packing_salt", "source_identity"]

MAGIC = b"LDRPACK\x01"
"""The first bytes of a bundle file, unless its owner names its own."""

Expected = Mapping[str, tuple[torch.dtype, tuple[int, ...]]]


def source_identity(files: Sequence[str]) -> list[dict[str, Any]]:
    """Each file's resolved path, size, inode and modification/change times: a changed file is another file."""
    identity = []
    for file in files:
        path = Path(file).resolve()
        stat = path.stat()
        identity.append({"path": str(path), "size": stat.st_size, "ino": stat.st_ino, "dev": stat.st_dev,
                         "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns})
    return identity


def packing_salt(code: Iterable[Path], **fields: object) -> dict[str, Any]:
    """What decides packed bytes besides the source: ``fields`` (a method's own format version, say), a digest of
    the method's packing ``code`` (its source files, read now) as ``code``, and the core's
    (:func:`~loader.kernels.packed_layout_fingerprint`: torch's version and int4 layout, the CPU capability, the
    core's packers) as ``core``."""
    digest = hashlib.sha256()
    for path in code:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return {**fields, "code": digest.hexdigest(), "core": packed_layout_fingerprint()}


class PackedBundle:
    """One load's use of the bundle for its source files and variant: units found, units built, then written.

    Thread-safe: layers post-processed on worker threads look up and store at once (the bundle is opened once,
    under a lock; packing runs outside it).

    :param folder: where the bundles of this kind live (one file each, ``<digest>.bin``).
    :param files: the source files whose identity names the bundle.
    :param variant: the load's options that change packed bytes (JSON values).
    :param salt: :func:`packing_salt` (computed on first use, when it is a callable).
    :param max_bytes: what the bundles of ``folder`` may take together once this one is written.
    :param magic: the file's first 8 bytes.
    :param kind: what a bundle is called in the notes ("not a packed GGUF bundle").
    """

    def __init__(self, folder: Path, files: Sequence[str], variant: Mapping[str, Any],
                 salt: Mapping[str, Any] | Callable[[], Mapping[str, Any]], *, max_bytes: int,
                 magic: bytes = MAGIC, kind: str = "packed-weights") -> None:
        if len(magic) != 8:
            raise ValueError(f"a bundle's magic is 8 bytes, not {magic!r}")
        self.folder = folder
        self.files = frozenset(str(f) for f in files)
        self.max_bytes = max_bytes
        self._variant = dict(variant)
        self._salt = salt
        self._magic = magic
        self._kind = kind
        self._lock = threading.Lock()
        self._opened = False
        self._stored: dict[str, Built] = {}
        self._used: dict[str, Built] = {}
        self._identity: dict[str, Any] | None = None
        self.path: Path | None = None
        self.hits = 0
        self.misses = 0
        self.written = False
        self.notes: list[str] = []
        """Why a bundle was not read or not written (for the load report)."""

    # -- reading -----------------------------------------------------------------

    def lookup(self, key: str, expected: Expected | None) -> Built | None:
        """The unit's tensors (views of the bundle's map), or ``None`` when the bundle does not hold it with the
        ``expected`` tensors (name -> dtype, shape; ``None``: whatever the unit holds, for an owner that checks
        the unit itself)."""
        with self._lock:
            if not self._opened:
                self._open()
            found = self._stored.get(key)
            if (found is not None and expected is not None
                    and {n: (t.dtype, tuple(t.shape)) for n, t in found.items()} != dict(expected)):
                self.notes.append(f"a stored unit ({', '.join(sorted(found))}) did not have the expected shapes; "
                                  "packed again")
                found = None
            if found is not None:
                self.hits += 1
                self._used[key] = found
            return found

    def store(self, key: str, built: Built) -> None:
        """A unit packed by this load (after :meth:`lookup` missed), written by :meth:`finish`."""
        with self._lock:
            self.misses += 1
            self._used[key] = built

    def cached(self, key: str, build: Callable[[], Built | None], expected: Expected | None) -> Built | None:
        """The unit ``key`` from the bundle, else ``build()``'s tensors, stored for the bundle (``build`` returns
        ``None`` for a result the bundle cannot hold: nothing is stored). A stored unit whose tensors are not
        ``expected`` is built again."""
        found = self.lookup(key, expected)
        if found is not None:
            return found
        built = build()
        if built is not None:
            self.store(key, built)
        return built

    def _open(self) -> None:
        """Find and map the bundle (once); a missing, unreadable or mismatched one leaves nothing stored."""
        self._opened = True
        try:
            salt = self._salt() if callable(self._salt) else self._salt
            self._identity = {"files": source_identity(sorted(self.files)), "salt": dict(salt),
                              "variant": self._variant}
        except OSError as exc:
            self.notes.append(f"not used: {exc}")
            return
        name = hashlib.sha256(json.dumps(self._identity, sort_keys=True).encode()).hexdigest()[:32]
        self.path = self.folder / f"{name}.bin"
        try:
            self._stored = read_bundle(self.path, self._magic, self._identity, self._kind)
        except (FileNotFoundError, NotADirectoryError):  # no bundle yet (or no folder to hold one)
            return
        except (OSError, ValueError) as exc:
            self.notes.append(f"{self.path.name} not read: {exc}")

    # -- writing -----------------------------------------------------------------

    def finish(self) -> None:
        """After a load that succeeded: write a new bundle when a unit was built here, else mark this one used.

        Then the units are forgotten: the model's layers hold them, and whatever keeps this bundle (a load's
        config, which every layer's method may keep) must not keep buffers alive that the layers replace later
        (``module.to``)."""
        try:
            self._finish()
        finally:
            self._used, self._stored = {}, {}

    def _finish(self) -> None:
        if self.path is None:
            return
        if self.misses == 0:
            if self.hits:
                touch(self.path)
            return
        assert self._identity is not None
        try:
            write_bundle(self.path, self._magic, self._identity, self._used)
        except OSError as exc:
            self.notes.append(f"{self.path.name} not written: {exc}")
            warn_cache_not_written(self.folder, exc)
            return
        self.written = True
        try:
            prune(self.folder, self.max_bytes, keep=self.path)
        except OSError as exc:
            self.notes.append(f"old bundles not removed: {exc}")

    def describe(self) -> dict[str, Any]:
        """For the load report: the bundle, units found and built, whether it was written, and notes."""
        return {"path": None if self.path is None else str(self.path), "hits": self.hits, "misses": self.misses,
                "written": self.written, "notes": list(self.notes)}
