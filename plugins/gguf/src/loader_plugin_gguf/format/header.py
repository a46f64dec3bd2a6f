"""Our own GGUF header reader: metadata, tensor table and where the data starts, validated.

Why not ``gguf.GGUFReader``: it builds a numpy array per metadata element (for a large
vocabulary, slower than a whole load should take), trusts every count in the
file (a string length of 2**60 or an array of 2**62 elements loops or allocates before it
fails) and reports malformed files as bare ``ValueError``/``IndexError``. This reader walks
the header once with ``struct`` over the bytes of the file, checks every count against the
bytes that are left *before* it loops or allocates, and raises a
:class:`~loader.errors.LoadError` subclass naming the file (and the key or tensor) for each
problem. gguf-py still provides the constants (value types, ggml types and block sizes).
The tensor table is then checked against ggml's layout rules in :mod:`.tensor_table`.
"""

from __future__ import annotations

import functools
import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import attrs
import numpy as np
from gguf.constants import GGUFValueType

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.io import u64_prefixed_end

from .metadata_map import GGUFMetadata, UndecodedString
from .tensor_table import TableEntry, TensorInfo, alignment_of, build_tensor_table

__all__ = ["GGUF_MAGIC", "SUPPORTED_VERSIONS", "GGUFHeader", "GGUFStrings", "TensorInfo", "read_header", "sniff"]

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v1 counted in 32 bits and is long gone
FIXED_HEADER = 24  # magic, version, tensor count, kv count
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, smallest value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8  # name length, n_dims, type, offset
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME_BYTES = 63  # GGML_MAX_NAME - 1: ggml keeps a tensor's name in a 64-byte C string
MAX_ELEMENTS = 2**63 - 1  # ggml counts a tensor's elements in an int64_t
# Limits on what a header may make us build, each far above any published model (tens of keys,
# ~2,000 tensors for the largest MoE split per expert, vocabulary + merges under 1M strings) and
# each bounding memory and time whatever the file claims: strings cost ~6x their bytes as
# Python objects, a tensor entry ~10x. Arrays of arrays are refused outright, as gguf_init does.
MAX_METADATA_KEYS = 65_536
MAX_TENSORS = 262_144
MAX_METADATA_STRINGS = 4_194_304
_U64 = struct.Struct("<Q")

_SCALARS: dict[int, tuple[str, Any]] = {
    GGUFValueType.UINT8: ("<B", np.uint8), GGUFValueType.INT8: ("<b", np.int8),
    GGUFValueType.UINT16: ("<H", np.uint16), GGUFValueType.INT16: ("<h", np.int16),
    GGUFValueType.UINT32: ("<I", np.uint32), GGUFValueType.INT32: ("<i", np.int32),
    GGUFValueType.FLOAT32: ("<f", np.float32), GGUFValueType.BOOL: ("<?", np.bool_),
    GGUFValueType.UINT64: ("<Q", np.uint64), GGUFValueType.INT64: ("<q", np.int64),
    GGUFValueType.FLOAT64: ("<d", np.float64),
}


@attrs.frozen
class GGUFHeader:
    """Everything in a GGUF file except the tensor data."""

    path: Path
    version: int
    metadata: Mapping[str, Any]
    tensors: tuple[TensorInfo, ...]
    data_start: int
    file_size: int

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise CheckpointFormatError(f"{self.path}: metadata key 'general.architecture' is missing")
        return arch

    def tensor_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tensors)


class _Cursor:
    """Reads little-endian values from the header bytes, failing with the file's name at the end."""

    def __init__(self, buf: bytes | mmap.mmap, path: Path, size: int) -> None:
        self.buf = buf
        self.path = path
        self.size = size
        self.pos = 0
        self.strings = 0  # string values read so far, against MAX_METADATA_STRINGS

    def count_strings(self, count: int, key: str) -> None:
        """Refuse ``count`` more string values for ``key`` past the header's limit, before reading them."""
        if self.strings + count > MAX_METADATA_STRINGS:
            raise CheckpointFormatError(
                f"{self.path}: metadata key {key!r} holds {count} strings, past the {MAX_METADATA_STRINGS} a "
                f"GGUF header may hold in all ({self.strings} read before it)"
            )
        self.strings += count

    def left(self) -> int:
        return self.size - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise CheckpointFormatError(
                f"{self.path}: truncated file: {what} needs {n} bytes at offset {self.pos}, "
                f"but the file ends {self.left()} bytes later"
            )

    def unpack(self, fmt: str, width: int, what: str) -> Any:
        self.need(width, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += width
        return value

    def raw_string(self, what: str) -> bytes:
        length = self.unpack("<Q", 8, f"the length of {what}")
        if length > self.left():
            raise CheckpointFormatError(
                f"{self.path}: truncated or corrupt file: {what} claims a string of {length} bytes at "
                f"offset {self.pos}, but only {self.left()} bytes are left in the file"
            )
        raw = bytes(self.buf[self.pos:self.pos + length])
        self.pos += length
        return raw

    def string(self, what: str) -> str:
        try:
            return self.raw_string(what).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CheckpointFormatError(f"{self.path}: {what} is not valid UTF-8 ({exc.reason})") from exc


def _read_value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype in _SCALARS:
        fmt, np_type = _SCALARS[vtype]
        width = np.dtype(np_type).itemsize
        return cur.unpack(fmt, width, f"the value of metadata key {key!r}")
    if vtype == GGUFValueType.STRING:
        cur.count_strings(1, key)
        raw = cur.raw_string(f"metadata key {key!r}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:  # refused when read: metadata_map's reason
            return UndecodedString(exc.reason)
    if vtype == GGUFValueType.ARRAY:
        item_type = cur.unpack("<I", 4, f"the item type of metadata key {key!r}")
        count = cur.unpack("<Q", 8, f"the length of metadata key {key!r}")
        if item_type in _SCALARS:
            _, np_type = _SCALARS[item_type]
            width = np.dtype(np_type).itemsize
            if count * width > cur.left():
                raise CheckpointFormatError(
                    f"{cur.path}: truncated or corrupt file: metadata key {key!r} claims an array of {count} "
                    f"items ({count * width} bytes), but only {cur.left()} bytes are left in the file"
                )
            values = np.frombuffer(cur.buf, dtype=np.dtype(np_type).newbyteorder("<"), count=count,
                                   offset=cur.pos).copy()
            cur.pos += count * width
            return values
        if item_type == GGUFValueType.ARRAY:
            raise CheckpointFormatError(f"{cur.path}: metadata key {key!r} holds an array of arrays, which "
                                        "ggml's gguf_init refuses (GGUF arrays hold scalars or strings)")
        if item_type != GGUFValueType.STRING:
            raise CheckpointFormatError(f"{cur.path}: metadata key {key!r} holds an array of unknown "
                                        f"value type {item_type}")
        if count * 8 > cur.left():
            raise CheckpointFormatError(
                f"{cur.path}: truncated or corrupt file: metadata key {key!r} claims an array of {count} "
                f"items, but only {cur.left()} bytes are left in the file"
            )
        cur.count_strings(count, key)
        return _read_string_array(cur, count, key)
    raise CheckpointFormatError(f"{cur.path}: metadata key {key!r} has unknown value type {vtype}")


def _read_string_array(cur: _Cursor, count: int, key: str) -> GGUFStrings:
    """The hot loop of a header (vocabularies, merges): walk the lengths, bounds-checked, decode nothing.

    Decoding ~100k vocabulary and merge strings is most of a header's parse, yet only a tokenizer reads
    them; a load needs the tensor table behind them. So the walk only finds where the array ends (in
    compiled C where a compiler is at hand: :func:`loader.io.u64_prefixed_end`), and
    :class:`GGUFStrings` keeps a copy of its bytes to decode when first read.
    """
    start = cur.pos
    end, done = u64_prefixed_end(cur.buf, start, count)
    if done < count:
        raise CheckpointFormatError(
            f"{cur.path}: truncated file: item {done} of the {count} strings of metadata key {key!r} "
            f"runs past the end of the file"
        )
    cur.pos = end
    return GGUFStrings(bytes(cur.buf[start:end]), count, f"{cur.path}: metadata key {key!r}")


class GGUFStrings(Sequence[str]):
    """A GGUF string array (vocabulary, merges), decoded from its bytes the first time it is read.

    Compares equal to a list of the same strings. A string that is not UTF-8 raises
    :class:`~loader.errors.CheckpointFormatError` naming the file, key and item when the array is read
    (a tokenizer is built), not when the header is parsed for a load that never reads it.
    """

    __slots__ = ("_count", "_items", "_raw", "_where")

    def __init__(self, raw: bytes, count: int, where: str) -> None:
        self._raw, self._count, self._where = raw, count, where
        self._items: list[str] | None = None

    def _decoded(self) -> list[str]:
        if self._items is None:
            raw, length_of, pos = self._raw, _U64.unpack_from, 0
            items: list[str] = []
            append = items.append
            try:
                for _ in range(self._count):
                    (length,) = length_of(raw, pos)
                    pos += 8
                    append(raw[pos:pos + length].decode("utf-8"))
                    pos += length
            except UnicodeDecodeError as exc:
                raise CheckpointFormatError(f"{self._where}: item {len(items)} is not valid UTF-8 "
                                            f"({exc.reason})") from exc
            self._items = items
        return self._items

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        return self._decoded()[index]

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GGUFStrings | list | tuple):
            return self._decoded() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable-list semantics, as the list it stands for

    def __repr__(self) -> str:
        return f"GGUFStrings({self._count} strings)"


def _read_tensor_info(cur: _Cursor, index: int) -> TableEntry:
    name = cur.string(f"the name of tensor #{index}")
    if len(name.encode()) > MAX_NAME_BYTES:
        raise CheckpointFormatError(f"{cur.path}: the name of tensor #{index} is {len(name.encode())} bytes long; "
                                    f"ggml allows at most {MAX_NAME_BYTES} ({name[:MAX_NAME_BYTES]!r}...)")
    n_dims = cur.unpack("<I", 4, f"the rank of tensor {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise CheckpointFormatError(f"{cur.path}: tensor {name!r} has {n_dims} dimensions; "
                                    f"GGUF allows 1 to {MAX_DIMS}")
    cur.need(8 * n_dims, f"the shape of tensor {name!r}")
    dims = struct.unpack_from(f"<{n_dims}q", cur.buf, cur.pos)
    cur.pos += 8 * n_dims
    if min(dims) < 0:
        raise CheckpointFormatError(f"{cur.path}: tensor {name!r} has a negative dimension ({min(dims)}) "
                                    f"in its shape {list(reversed(dims))}")
    if math.prod(dims) > MAX_ELEMENTS:
        raise CheckpointFormatError(f"{cur.path}: tensor {name!r} has more elements than ggml can count "
                                    f"(shape {list(reversed(dims))}, at most {MAX_ELEMENTS} in all)")
    ggml_type = cur.unpack("<I", 4, f"the type of tensor {name!r}")
    offset = cur.unpack("<Q", 8, f"the data offset of tensor {name!r}")
    return name, tuple(reversed(dims)), ggml_type, offset


def sniff(path: Path) -> int:
    """Check the magic and version of ``path`` and return the version; reads 8 bytes."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise CheckpointFormatError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    if len(head) < 8:
        raise CheckpointFormatError(f"{path}: truncated file: {len(head)} bytes, shorter than a GGUF header")
    if head[:4] != GGUF_MAGIC:
        raise CheckpointFormatError(f"{path}: not a GGUF file: starts with {head[:4]!r}, expected {GGUF_MAGIC!r}")
    (version,) = struct.unpack_from("<I", head, 4)
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            raise UnsupportedError(f"{path}: big-endian GGUF files are not supported")
        raise UnsupportedError(
            f"{path}: GGUF version {version} is not supported; expected one of {list(SUPPORTED_VERSIONS)}"
        )
    return int(version)


def _parse(path: Path) -> GGUFHeader:
    version = sniff(path)
    size = path.stat().st_size
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        cur = _Cursor(mm, path, size)
        cur.need(FIXED_HEADER, "the GGUF header")
        cur.pos = 8
        tensor_count = cur.unpack("<Q", 8, "the tensor count")
        kv_count = cur.unpack("<Q", 8, "the metadata count")
        for what, count, least in (("metadata count", kv_count, MIN_KV_BYTES),
                                   ("tensor count", tensor_count, MIN_TENSOR_INFO_BYTES)):
            if count * least > cur.left():
                raise CheckpointFormatError(
                    f"{path}: truncated or corrupt file: {what} {count} needs at least {count * least} "
                    f"bytes, but only {cur.left()} are left in the file"
                )
        for what, count, limit in (("metadata keys", kv_count, MAX_METADATA_KEYS),
                                   ("tensors", tensor_count, MAX_TENSORS)):
            if count > limit:
                raise CheckpointFormatError(f"{path}: the header lists {count} {what}; a GGUF file may hold "
                                            f"at most {limit}")
        metadata: dict[str, Any] = {}
        value_types: dict[str, int] = {}
        for i in range(kv_count):
            key = cur.string(f"the name of metadata key #{i}")
            if not key:
                raise CheckpointFormatError(f"{path}: metadata key #{i} has an empty name")
            vtype = cur.unpack("<I", 4, f"the type of metadata key {key!r}")
            if key in metadata:
                raise CheckpointFormatError(f"{path}: metadata key {key!r} appears twice")
            value_types[key] = vtype
            metadata[key] = _read_value(cur, vtype, key)
        entries = [_read_tensor_info(cur, i) for i in range(tensor_count)]
        header_end = cur.pos
    alignment = alignment_of(path, metadata, value_types)
    data_start = -(-header_end // alignment) * alignment
    tensors = build_tensor_table(path, entries, data_start=data_start, alignment=alignment, file_size=size)
    return GGUFHeader(path=path, version=version, metadata=GGUFMetadata(path, metadata), tensors=tensors,
                      data_start=data_start, file_size=size)


@functools.lru_cache(maxsize=16)
def _cached(path: str, size: int, mtime_ns: int, inode: int) -> GGUFHeader:
    return _parse(Path(path))


def read_header(path: Path | str) -> GGUFHeader:
    """Parse and validate ``path``'s header; cached while the file is unchanged (same size, mtime, inode)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as exc:
        raise CheckpointFormatError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    return _cached(os.fspath(p), st.st_size, st.st_mtime_ns, st.st_ino)
