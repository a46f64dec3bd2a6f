"""Packed GGUF weights kept on disk, so that a second load maps them instead of packing them again.

Why: packing SmolLM2's Q4_1 layers is cheap work (~15 ms of byte shuffles)
but it writes ~100 MB of fresh memory, and a process's first write to a page
costs more than the shuffle (0.4-0.6 ms a MB on a VM, more than half of the
load); llama.cpp computes on its memory-mapped file, whose pages the page
cache already holds. Once written, the packed bytes are such a file too: a
later load maps them copy-on-write (touching 100 MB of a cached file: ~2 ms,
against ~45 ms for fresh memory) and the layers' buffers are views of the map.
Like OpenVINO's ``CACHE_DIR`` or a compiled-kernel cache, the first load of a
file pays (it packs, then writes the bundle), every later one is cheap.

One bundle per set of GGUF files and per *variant* (tensor parallel rank and
size, kernel and dense dtypes), under ``<cache root>/gguf-packed/``
(:func:`loader.io.cache_root`: ``$LOADER_CACHE_DIR`` or the user cache
folder). A bundle holds *units*, each the tensors one packing call made, under
a key that spells out everything that decides its bytes (the parts' files,
offsets, block types, windows and row orders, the kernel and its dtype); it
is found by a digest of the files' identity (resolved path, size, inode,
modification and change times), the *salt* (the packing code's own source
digest, torch's version and int4 layout, the CPU capability) and the variant,
and all three are compared again in full when it is opened, so a changed file,
another torch or an edited packer misses instead of loading stale bytes.

Writing: a load that packed anything it did not find writes a new bundle
holding every unit it used, to a temporary file that is fsynced and then
renamed over the old one (readers that mapped the old file keep it; a crash
leaves a temporary file, never a half bundle under the bundle's name), and
the least recently used bundles are removed beyond :data:`DEFAULT_MAX_BYTES`
(``LOADER_GGUF_CACHE_MAX_BYTES``). A bundle that cannot be read, does not
match or cannot be written is reported in the load report and the load packs
as it would without one: the cache never fails a load. Off with
``format_options={"packed_cache": False}`` (CLI ``--format-option
packed_cache=false``) or ``LOADER_GGUF_PACKED_CACHE=0``.

What it does not check: the bytes themselves (a checksum would read the whole
bundle, what mapping it avoids); a bundle edited in place is trusted as
llama.cpp trusts its file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import struct
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from loader.checkpoint import LoadOptions
    from loader.weights import CheckpointTensor

__all__ = ["DEFAULT_MAX_BYTES", "FORMAT", "MAGIC", "PackedCache", "cache_folder", "cache_requested",
           "source_identity", "unit_key"]

FORMAT = 1
MAGIC = b"LDRGGPK\x01"
_ALIGN = 64
_HEADER = struct.Struct("<8sQ")  # magic, length of the JSON index that follows
DEFAULT_MAX_BYTES = 8 << 30
"""What the bundles together may take on disk before the least recently used are removed (8 GiB)."""
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.uint8, torch.int8, torch.int32, torch.int64,
                                                      torch.float32, torch.float16, torch.bfloat16)}
_STALE_TEMP_SECONDS = 3600.0
_MADV_POPULATE_READ = 22  # Linux 5.14+

Built = dict[str, torch.Tensor]


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


def source_identity(files: Sequence[str]) -> list[dict[str, Any]]:
    """Each file's resolved path, size, inode and modification/change times: a changed file is another file."""
    identity = []
    for file in files:
        path = Path(file).resolve()
        stat = path.stat()
        identity.append({"path": str(path), "size": stat.st_size, "ino": stat.st_ino, "dev": stat.st_dev,
                         "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns})
    return identity


_SALT: dict[str, Any] | None = None
_SALT_LOCK = threading.Lock()


def _salt() -> dict[str, Any]:
    """What decides the packed bytes besides the source: this plugin's packing code (its source files' digest)
    and the core's (:func:`loader.kernels.packed_layout_fingerprint`: torch's version and int4 layout, the CPU
    capability, the core's packers). Computed once a process."""
    global _SALT
    with _SALT_LOCK:
        if _SALT is None:
            from loader.kernels import packed_layout_fingerprint

            here = Path(__file__).resolve().parent
            digest = hashlib.sha256()
            for name in ("embedding.py", "half_split.py", "kernels_kquants.py", "kernels_legacy.py",
                         "packed_cache.py", "packed_linear.py", "q4_blocks.py", "tensors.py"):
                digest.update(name.encode() + b"\0" + (here / name).read_bytes())
            _SALT = {"format": FORMAT, "code": digest.hexdigest(), "core": packed_layout_fingerprint()}
        return _SALT


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


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


class PackedCache:
    """One load's use of the bundle for its GGUF files and variant: units found, units built, then written.

    Thread-safe: layers post-processed on worker threads look up and store at
    once (the bundle is opened once, under a lock; packing runs outside it).
    """

    def __init__(self, folder: Path, files: Sequence[str], variant: Mapping[str, Any]) -> None:
        self.folder = folder
        self.files = frozenset(str(f) for f in files)
        self._variant = dict(variant)
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

    def lookup(self, key: str, expected: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]) -> Built | None:
        """The unit's tensors (views of the bundle's map), or ``None`` when the bundle does not hold it with the
        ``expected`` tensors (name -> dtype, shape)."""
        with self._lock:
            if not self._opened:
                self._open()
            found = self._stored.get(key)
            if found is not None and {n: (t.dtype, tuple(t.shape)) for n, t in found.items()} != dict(expected):
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

    def _open(self) -> None:
        """Find and map the bundle (once); a missing, unreadable or mismatched one leaves nothing stored."""
        self._opened = True
        try:
            self._identity = {"files": source_identity(sorted(self.files)), "salt": _salt(),
                              "variant": self._variant}
        except OSError as exc:
            self.notes.append(f"not used: {exc}")
            return
        name = hashlib.sha256(json.dumps(self._identity, sort_keys=True).encode()).hexdigest()[:32]
        self.path = self.folder / f"{name}.bin"
        try:
            self._stored = self._read(self.path, self._identity)
        except (FileNotFoundError, NotADirectoryError):  # no bundle yet (or no folder to hold one)
            return
        except (OSError, ValueError) as exc:
            self.notes.append(f"{self.path.name} not read: {exc}")

    @staticmethod
    def _read(path: Path, identity: Mapping[str, Any]) -> dict[str, Built]:
        """Every unit of the bundle at ``path`` as views of its copy-on-write map; ``ValueError`` says what is wrong."""
        with path.open("rb") as fh:
            head = fh.read(_HEADER.size)
            if len(head) < _HEADER.size or head[:8] != MAGIC:
                raise ValueError("not a packed GGUF bundle (bad magic)")
            _, index_bytes = _HEADER.unpack(head)
            size = os.fstat(fh.fileno()).st_size
            if index_bytes > size - _HEADER.size:
                raise ValueError(f"its index ({index_bytes} bytes) runs past the end of the file ({size} bytes)")
            try:
                index = json.loads(fh.read(index_bytes))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"its index is not JSON ({exc})") from None
            if not isinstance(index, dict) or any(index.get(k) != identity[k] for k in ("files", "salt", "variant")):
                raise ValueError("it was written for other files, packing code or options")
            data_start = _aligned(_HEADER.size + index_bytes)
            units = index.get("units")
            if not isinstance(units, dict) or index.get("data_bytes") != size - data_start:
                raise ValueError(f"its data should be {index.get('data_bytes')} bytes, the file holds "
                                 f"{size - data_start}")
            if size == data_start:
                return {}
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)  # writable for torch, never written back
        _populate(mapped)
        return {key: _views(mapped, data_start, key, entries) for key, entries in units.items()}

    # -- writing -----------------------------------------------------------------

    def finish(self) -> None:
        """After a load that succeeded: write a new bundle when a unit was built here, else mark this one used.

        Then the units are forgotten: the model's layers hold them, and the load's config (which every layer's
        method keeps) must not keep buffers alive that the layers replace later (``module.to``)."""
        try:
            self._finish()
        finally:
            self._used, self._stored = {}, {}

    def _finish(self) -> None:
        if self.path is None:
            return
        if self.misses == 0:
            if self.hits:
                _touch(self.path)
            return
        try:
            self._write(self.path)
        except OSError as exc:
            self.notes.append(f"{self.path.name} not written: {exc}")
            return
        self.written = True
        try:
            _prune(self.folder, _max_bytes(), keep=self.path)
        except OSError as exc:
            self.notes.append(f"old bundles not removed: {exc}")

    def _write(self, path: Path) -> None:
        """Every used unit, to a temporary file fsynced and renamed to ``path``."""
        assert self._identity is not None
        units: dict[str, list[list[Any]]] = {}
        tensors: list[torch.Tensor] = []
        at = 0
        for key in sorted(self._used):
            entries = []
            for name, tensor in sorted(self._used[key].items()):
                flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
                at = _aligned(at)
                entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), at])
                tensors.append(flat)
                at += flat.numel()
            units[key] = entries
        index = json.dumps({**self._identity, "units": units, "data_bytes": _aligned(at) if tensors else 0},
                           sort_keys=True).encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f"{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(descriptor, "wb") as fh:
                fh.write(_HEADER.pack(MAGIC, len(index)) + index)
                fh.write(bytes(_aligned(_HEADER.size + len(index)) - _HEADER.size - len(index)))
                written = 0
                for flat in tensors:
                    fh.write(bytes(_aligned(written) - written))
                    fh.write(flat.numpy().data)
                    written = _aligned(written) + flat.numel()
                fh.write(bytes(_aligned(written) - written))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(temp, path)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        _fsync_folder(path.parent)

    def describe(self) -> dict[str, Any]:
        """For the load report: the bundle, units found and built, whether it was written, and notes."""
        return {"path": None if self.path is None else str(self.path), "hits": self.hits, "misses": self.misses,
                "written": self.written, "notes": list(self.notes)}


def _views(mapped: mmap.mmap, data_start: int, key: str, entries: object) -> Built:
    """One unit's tensors over the bundle's data, each on a storage of its own (``torch.save`` refuses tensors
    that view one storage as different dtypes); ``ValueError`` for an entry that does not fit."""
    data_bytes = len(mapped) - data_start
    if not isinstance(entries, list):
        raise ValueError(f"unit {key[:60]!r}: not a list of tensors")
    views: Built = {}
    for entry in entries:
        try:
            name, dtype_name, shape, offset = entry
            dtype = _DTYPES[dtype_name]
            shape = [int(d) for d in shape]
            offset = int(offset)
        except (TypeError, ValueError, KeyError):
            raise ValueError(f"unit {key[:60]!r}: a bad tensor entry {entry!r}") from None
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if min(shape, default=1) < 0 or offset < 0 or offset % _ALIGN or offset + nbytes > data_bytes:
            raise ValueError(f"unit {key[:60]!r}: tensor {name!r} ({nbytes} bytes at {offset}) lies outside the "
                             f"{data_bytes} data bytes")
        if numel == 0:
            views[str(name)] = torch.empty(shape, dtype=dtype)
            continue
        views[str(name)] = torch.frombuffer(mapped, dtype=dtype, count=numel, offset=data_start + offset).view(shape)
    return views


def _populate(mapped: mmap.mmap) -> None:
    """Map the bundle's pages now, from the page cache (``MADV_POPULATE_READ``, no copy), so that the load ends
    with its layers resident, as the core's mapped parameters do, rather than the first forward faulting them
    in (~10 ms for SmolLM2's 66 MB either way). Older kernels refuse the advice; the pages then fault in on use."""
    with contextlib.suppress(OSError, ValueError):
        mapped.madvise(_MADV_POPULATE_READ)


def _touch(path: Path) -> None:
    """Mark a bundle used now (pruning removes the least recently used first)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def _prune(folder: Path, max_bytes: int, keep: Path) -> None:
    """Remove the least recently used bundles until the rest fit ``max_bytes`` (``keep`` stays), and temporary
    files older than an hour (a writer that died)."""
    now = time.time()
    bundles = []
    for entry in folder.iterdir():
        try:
            stat = entry.stat()
        except FileNotFoundError:
            continue
        if entry.suffix == ".tmp":
            if now - stat.st_mtime > _STALE_TEMP_SECONDS:
                entry.unlink(missing_ok=True)
        elif entry.suffix == ".bin" and entry != keep:
            bundles.append((stat.st_mtime, stat.st_size, entry))
    total = sum(size for _, size, _ in bundles) + keep.stat().st_size
    for _, size, entry in sorted(bundles):
        if total <= max_bytes:
            break
        entry.unlink(missing_ok=True)
        total -= size
