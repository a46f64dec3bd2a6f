"""The packed-weights bundle on disk: one file, a JSON index then aligned tensor bytes; read as copy-on-write views,
written atomically, pruned least recently used first.

Layout: ``magic (8 bytes) | index length (u64, little-endian) | index (JSON) | zero padding to 64 bytes | data``.
The index holds the bundle's identity (whatever its owner compares: source files, packing code, options) and,
per unit key, ``[name, dtype, shape, offset]`` for each tensor, offsets into the data and 64-byte aligned.

What is checked when a bundle is read: the magic, that the index fits the file and is JSON, the identity
(every key compared in full), that the data is as long as the index says, and that every tensor entry is
well formed and lies inside the data — not the bytes themselves (a checksum would read the whole bundle,
what mapping it avoids): a bundle edited in place is trusted, as llama.cpp trusts its file.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .._atomic_file import replaced_atomically
from .._io_pool import run_in_pool

__all__ = ["ALIGN", "Built", "prune", "read_bundle", "touch", "write_bundle"]

ALIGN = 64
_HEADER = struct.Struct("<8sQ")  # magic, length of the JSON index that follows
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.uint8, torch.int8, torch.int32, torch.int64,
                                                      torch.float32, torch.float16, torch.bfloat16)}
_STALE_TEMP_SECONDS = 3600.0
_MADV_POPULATE_READ = 22  # Linux 5.14+

Built = dict[str, torch.Tensor]
"""One unit: the tensors one packing call made, by name."""


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


def read_bundle(path: Path, magic: bytes, identity: Mapping[str, Any], kind: str) -> dict[str, Built]:
    """Every unit of the bundle at ``path`` as views of its copy-on-write map.

    :param identity: what the index must hold under each of its keys (compared in full).
    :param kind: what the bundle is called in errors (``packed GGUF``: "not a packed GGUF bundle").
    :raises ValueError: saying what is wrong with the file; ``OSError`` when it cannot be read.
    """
    with path.open("rb") as fh:
        head = fh.read(_HEADER.size)
        if len(head) < _HEADER.size or head[:8] != magic:
            raise ValueError(f"not a {kind} bundle (bad magic)")
        _, index_bytes = _HEADER.unpack(head)
        size = os.fstat(fh.fileno()).st_size
        if index_bytes > size - _HEADER.size:
            raise ValueError(f"its index ({index_bytes} bytes) runs past the end of the file ({size} bytes)")
        try:
            index = json.loads(fh.read(index_bytes))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"its index is not JSON ({exc})") from None
        if not isinstance(index, dict) or any(index.get(k) != v for k, v in identity.items()):
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
        if min(shape, default=1) < 0 or offset < 0 or offset % ALIGN or offset + nbytes > data_bytes:
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
    in. Older kernels refuse the advice; the pages then fault in on use."""
    with contextlib.suppress(OSError, ValueError):
        mapped.madvise(_MADV_POPULATE_READ)


def write_bundle(path: Path, magic: bytes, identity: Mapping[str, Any], units: Mapping[str, Built]) -> None:
    """``units`` (and ``identity`` in the index) to a temporary file in ``path``'s folder, fsynced and renamed
    over ``path``: readers that mapped the old file keep it, and a crash leaves a temporary file, never a half
    bundle under the bundle's name."""
    entries_of: dict[str, list[list[Any]]] = {}
    tensors: list[torch.Tensor] = []
    at = 0
    for key in sorted(units):
        entries = []
        for name, tensor in sorted(units[key].items()):
            flat = tensor.detach().contiguous().view(-1).view(torch.uint8)
            at = _aligned(at)
            entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), at])
            tensors.append(flat)
            at += flat.numel()
        entries_of[key] = entries
    index = json.dumps({**identity, "units": entries_of, "data_bytes": _aligned(at) if tensors else 0},
                       sort_keys=True).encode()
    data_start = _aligned(_HEADER.size + len(index))
    with replaced_atomically(path, prefix=f"{path.stem}.", durable=True) as fh:
        fh.write(_HEADER.pack(magic, len(index)) + index)
        fh.write(bytes(data_start - _HEADER.size - len(index)))
        fh.flush()
        os.ftruncate(fh.fileno(), data_start + (_aligned(at) if tensors else 0))  # the gaps read back as zeros
        _write_at(fh.fileno(), data_start, tensors)


_WRITE_CHUNK = 16 << 20


def _write_at(descriptor: int, data_start: int, tensors: list[torch.Tensor]) -> None:
    """Each tensor's bytes at its aligned offset after ``data_start``, in chunks written side by side on the I/O
    pool (``os.pwrite`` releases the GIL): filling fresh page-cache pages is most of writing a bundle, and two
    writers fill them faster than one."""
    tasks: list[Callable[[], None]] = []
    at = 0
    for flat in tensors:
        at = _aligned(at)
        view = flat.numpy().data
        for start in range(0, flat.numel(), _WRITE_CHUNK):
            chunk = view[start:start + _WRITE_CHUNK]
            tasks.append(functools.partial(_pwrite_all, descriptor, chunk, data_start + at + start))
        at += flat.numel()
    run_in_pool(tasks)


def _pwrite_all(descriptor: int, data: memoryview, offset: int) -> None:
    while len(data):
        done = os.pwrite(descriptor, data, offset)
        data, offset = data[done:], offset + done


def touch(path: Path) -> None:
    """Mark a bundle used now (pruning removes the least recently used first)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def prune(folder: Path, max_bytes: int, keep: Path) -> None:
    """Remove the least recently used bundles (``*.bin``) until the rest fit ``max_bytes`` (``keep`` stays), and
    temporary files older than an hour (a writer that died)."""
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
