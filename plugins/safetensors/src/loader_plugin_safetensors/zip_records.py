"""Where each record of a ``torch.save`` zip archive lies, checked before any byte of it is trusted.

A zip-format ``.bin`` is a zip archive: ``<archive>/data.pkl`` (the pickled
structure), one ``<archive>/data/<key>`` record per storage, and a few small
records. ``torch.save`` writes every record *stored* (raw bytes, 64-byte
aligned), so a storage can be read at an offset; but any zip tool may repack
the archive with DEFLATE, and then the bytes at that offset are compressed
data (read as weights, they are NaN logits). So the offset of a record's data
comes from its *local* header (the central directory does not hold it), each
record says whether it is stored, and a record is read in place only then.

The central directory is parsed by :mod:`zipfile` (it handles zip64 and
refuses overlapping entries); the local headers are read here. Every check a
reader relies on later (data inside the file, local header agreeing with the
central directory, a stored record's sizes equal, records not overlapping) is
made once, and each failure is a :class:`~loader.errors.CheckpointFormatError`
naming the file and the record.
"""

from __future__ import annotations

import itertools
import os
import struct
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from typing import BinaryIO

import attrs

from loader.errors import CheckpointFormatError
from loader.io import truncated_error

__all__ = ["STORED", "DEFLATED", "ZipRecord", "read_record", "read_zip_records"]

STORED = zipfile.ZIP_STORED
DEFLATED = zipfile.ZIP_DEFLATED
_METHODS = {STORED: "stored", DEFLATED: "deflate"}
"""What torch's own reader (miniz) decompresses; other methods it refuses, and so do we."""

_LOCAL = struct.Struct("<4sHHHHHIIIHH")
_LOCAL_MAGIC = b"PK\x03\x04"
_ENCRYPTED = 0x1


@attrs.frozen
class ZipRecord:
    """One archive member: its data's absolute offset, sizes and compression method."""

    name: str
    method: int
    data_offset: int
    compressed_size: int
    size: int
    crc: int

    @property
    def stored(self) -> bool:
        """Whether the data is the record's bytes as they are (readable at :attr:`data_offset`)."""
        return self.method == STORED

    @property
    def data_end(self) -> int:
        return self.data_offset + self.compressed_size


def read_zip_records(path: str, fh: BinaryIO) -> Mapping[str, ZipRecord]:
    """Every member of the zip archive open as ``fh`` (of ``path``), checked, in archive order.

    :raises CheckpointFormatError: if the archive or one of its records is damaged.
    """
    file_size = os.fstat(fh.fileno()).st_size
    try:
        with zipfile.ZipFile(fh) as archive:
            infos = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError) as exc:
        raise CheckpointFormatError(
            f"{path}: cannot read as a PyTorch checkpoint: the zip archive is damaged or truncated ({exc})"
        ) from exc
    records: dict[str, ZipRecord] = {}
    for info in infos:
        if info.filename in records:
            raise CheckpointFormatError(f"{path}: zip record {info.filename!r} appears twice")
        records[info.filename] = _checked(path, fh, info, file_size)
    _check_disjoint(path, records.values())
    return records


def _checked(path: str, fh: BinaryIO, info: zipfile.ZipInfo, file_size: int) -> ZipRecord:
    what = f"zip record {info.filename!r}"
    if info.flag_bits & _ENCRYPTED:
        raise CheckpointFormatError(f"{path}: {what} is encrypted")
    if info.compress_type not in _METHODS:
        raise CheckpointFormatError(
            f"{path}: {what} uses compression method {info.compress_type}; expected stored (0) or deflate (8)"
        )
    header = os.pread(fh.fileno(), _LOCAL.size, info.header_offset)
    if len(header) < _LOCAL.size:
        raise truncated_error(path, what, file_size, info.header_offset + _LOCAL.size)
    magic, _, _, method, _, _, _, _, _, name_length, extra_length = _LOCAL.unpack(header)
    if magic != _LOCAL_MAGIC:
        raise CheckpointFormatError(
            f"{path}: {what}: no local header at byte {info.header_offset} (found {magic!r}, expected {_LOCAL_MAGIC!r})"
        )
    name = os.pread(fh.fileno(), name_length, info.header_offset + _LOCAL.size)
    if method != info.compress_type or name.decode("utf-8", "replace") != info.filename:
        raise CheckpointFormatError(
            f"{path}: {what}: the local header (name {name.decode('utf-8', 'replace')!r}, method {method}) "
            f"disagrees with the central directory (method {info.compress_type})"
        )
    record = ZipRecord(info.filename, info.compress_type, info.header_offset + _LOCAL.size + name_length
                       + extra_length, info.compress_size, info.file_size, info.CRC)
    if record.stored and record.compressed_size != record.size:
        raise CheckpointFormatError(
            f"{path}: {what} is stored but its sizes differ ({record.compressed_size} bytes in the archive, "
            f"{record.size} declared)"
        )
    if record.data_end > file_size:
        raise truncated_error(path, what, file_size, record.data_end)
    return record


def _check_disjoint(path: str, records: Iterable[ZipRecord]) -> None:
    """No record's data may run into the next record's local header (two records sharing bytes)."""
    ordered = sorted(records, key=lambda r: r.data_offset)
    for before, after in itertools.pairwise(ordered):
        if before.data_end > after.data_offset - _LOCAL.size:
            raise CheckpointFormatError(
                f"{path}: zip records {before.name!r} (data bytes [{before.data_offset}, {before.data_end})) "
                f"and {after.name!r} (data from byte {after.data_offset}) overlap"
            )


def read_record(path: str, fh: BinaryIO, record: ZipRecord) -> bytes:
    """The whole (decompressed) content of ``record``, its CRC checked; for small records and deflated data.

    :raises CheckpointFormatError: if the data is cut short, does not inflate, or fails its CRC.
    """
    raw = os.pread(fh.fileno(), record.compressed_size, record.data_offset)
    if len(raw) < record.compressed_size:
        raise truncated_error(path, f"zip record {record.name!r}", record.data_offset + len(raw), record.data_end)
    data = raw
    if not record.stored:
        try:
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            data = inflater.decompress(raw, record.size + 1)  # bounded: one byte too many is enough to tell
        except zlib.error as exc:
            raise CheckpointFormatError(f"{path}: zip record {record.name!r} does not inflate ({exc})") from exc
    if len(data) != record.size:
        raise CheckpointFormatError(
            f"{path}: zip record {record.name!r} holds {len(data)} bytes, but its header declares {record.size}"
        )
    if zlib.crc32(data) != record.crc:
        raise CheckpointFormatError(f"{path}: zip record {record.name!r} fails its CRC check (damaged data)")
    return data
