"""NumPy ``.npz`` archives read as checkpoint tensors that narrow before they read.

``numpy.savez(path, **state_dict)`` writes a zip archive with one ``<name>.npy``
member per array: a short header (dtype, shape, memory order), then the values
in row-major order. The iterator reads only the headers. A :class:`NpzTensor`
reads its values when a weight loader asks — after a dim-0 narrow (how a
tensor-parallel rank takes its rows) only the rows it kept. A member written
uncompressed (``savez``) is read at its offset in the archive; a compressed one
(``savez_compressed``) through :mod:`zipfile`, which inflates from the member's
start, so narrowing saves memory there but not reading time.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from collections.abc import Iterator, Sequence
from typing import IO, BinaryIO

import attrs
import numpy
import torch

from loader.errors import CheckpointFormatError
from loader.io import pread_exactly
from loader.weights import CheckpointTensor, ReadStats

__all__ = ["NpyMember", "NpzTensor", "iter_npz_weights", "read_member"]

# numpy dtype (kind + item size) -> torch dtype; numpy has no bfloat16, so a bf16 state dict is saved as float32.
_TORCH_DTYPES = {
    "f2": torch.float16, "f4": torch.float32, "f8": torch.float64,
    "i1": torch.int8, "i2": torch.int16, "i4": torch.int32, "i8": torch.int64,
    "u1": torch.uint8, "b1": torch.bool,
}
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # zip local file header: signature ... name length, extra length


@attrs.frozen
class NpyMember:
    """Where one array's values lie in an archive, and what they are."""

    archive: str
    member: str
    compressed: bool
    offset: int
    """Where the first value is: in the archive file when stored, in the inflated member when compressed."""
    shape: tuple[int, ...]
    dtype: numpy.dtype
    torch_dtype: torch.dtype

    @property
    def name(self) -> str:
        return self.member.removesuffix(".npy")

    def describe(self) -> str:
        return f"array {self.name!r} in {self.archive}"


def _npy_header(stream: IO[bytes], where: str) -> tuple[tuple[int, ...], bool, numpy.dtype]:
    try:
        version = numpy.lib.format.read_magic(stream)
        if version == (1, 0):
            return numpy.lib.format.read_array_header_1_0(stream)
        if version == (2, 0):
            return numpy.lib.format.read_array_header_2_0(stream)
    except ValueError as exc:
        raise CheckpointFormatError(f"{where}: not a .npy array header ({exc})") from None
    raise CheckpointFormatError(f"{where}: .npy format version {version} is not supported (1.0 or 2.0)")


def _member_start(raw: BinaryIO, info: zipfile.ZipInfo, where: str) -> int:
    """The archive offset of a stored member's first byte: after its local header, name and extra field."""
    raw.seek(info.header_offset)
    signature, name_len, extra_len = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size).ljust(_LOCAL_HEADER.size))
    if signature != b"PK\x03\x04":
        raise CheckpointFormatError(f"{where}: the zip local header is damaged")
    return info.header_offset + _LOCAL_HEADER.size + name_len + extra_len


def read_member(archive: str, raw: BinaryIO, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> NpyMember:
    """Read one member's ``.npy`` header; raise :class:`CheckpointFormatError` for what cannot be a weight."""
    where = f"{info.filename!r} in {archive}"
    if not info.filename.endswith(".npy"):
        raise CheckpointFormatError(f"{where}: not a .npy array (numpy.savez writes only <name>.npy members)")
    with zf.open(info) as stream:
        shape, fortran_order, dtype = _npy_header(stream, where)
        header_end = stream.tell()
    torch_dtype = _TORCH_DTYPES.get(f"{dtype.kind}{dtype.itemsize}")
    if dtype.hasobject or torch_dtype is None:
        raise CheckpointFormatError(
            f"{where}: dtype {dtype} has no torch equivalent; save numbers (bfloat16 as t.float().numpy())"
        )
    if fortran_order:
        raise CheckpointFormatError(f"{where}: stored in Fortran order; save numpy.ascontiguousarray(array)")
    nbytes = dtype.itemsize * math.prod(shape)
    if info.file_size < header_end + nbytes:
        raise CheckpointFormatError(
            f"{where}: holds {info.file_size - header_end} bytes of values, its header promises {nbytes}"
        )
    compressed = info.compress_type != zipfile.ZIP_STORED
    offset = header_end if compressed else _member_start(raw, info, where) + header_end
    return NpyMember(archive, info.filename, compressed, offset, tuple(shape), dtype, torch_dtype)


class NpzTensor(CheckpointTensor):
    """One array of an archive; ``narrow`` only records which rows and columns to keep."""

    def __init__(self, member: NpyMember, stats: ReadStats,
                 rows: tuple[int, int] | None = None, inner: tuple[tuple[int, int, int], ...] = ()) -> None:
        self.member = member
        self.stats = stats
        self.name = member.name
        self.file = member.archive
        self._rows = rows if rows is not None else (0, member.shape[0] if member.shape else 1)
        self._inner = inner  # (dim, start, length) narrows of dims >= 1, applied after the rows are read

    @property
    def shape(self) -> tuple[int, ...]:
        shape = list(self.member.shape)
        if shape:
            shape[0] = self._rows[1]
        for dim, _, length in self._inner:
            shape[dim] = length
        return tuple(shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.member.torch_dtype

    def narrow(self, dim: int, start: int, length: int) -> NpzTensor:
        dim = self.check_narrow(dim, start, length)
        if dim == 0:
            return NpzTensor(self.member, self.stats, (self._rows[0] + start, length), self._inner)
        return NpzTensor(self.member, self.stats, self._rows, (*self._inner, (dim, start, length)))

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        m = self.member
        row_bytes = m.dtype.itemsize * math.prod(m.shape[1:])
        first, count = self._rows
        buffer = bytearray(count * row_bytes)
        _read_values(m, m.offset + first * row_bytes, buffer)
        self.stats.add(len(buffer), tensors=1)
        array = numpy.frombuffer(buffer, dtype=m.dtype).reshape((count, *m.shape[1:]) if m.shape else ())
        if not m.dtype.isnative:
            array = array.astype(m.dtype.newbyteorder("="))
        values = torch.from_numpy(array)
        for dim, start, length in self._inner:
            values = values.narrow(dim, start, length)
        return values.to(dtype or values.dtype).contiguous()


def _read_values(member: NpyMember, offset: int, into: bytearray) -> None:
    what = f"array {member.name!r}"
    if not member.compressed:
        fd = os.open(member.archive, os.O_RDONLY)
        try:
            pread_exactly(fd, memoryview(into), offset, member.archive, what)
        finally:
            os.close(fd)
        return
    with zipfile.ZipFile(member.archive) as zf, zf.open(member.member) as stream:
        stream.seek(offset)
        values = stream.read(len(into))
    if len(values) != len(into):
        raise CheckpointFormatError(f"{member.describe()}: the compressed member ends early")
    into[:] = values


def iter_npz_weights(files: Sequence[str], stats: ReadStats) -> Iterator[tuple[str, NpzTensor]]:
    """``(name, NpzTensor)`` for every array of ``files`` in archive order; reads headers only."""
    for archive in files:
        try:
            with open(archive, "rb") as raw, zipfile.ZipFile(archive) as zf:
                members = [read_member(archive, raw, zf, info) for info in zf.infolist()]
        except (zipfile.BadZipFile, OSError) as exc:
            raise CheckpointFormatError(f"{archive}: not a readable .npz archive ({exc})") from None
        for member in members:
            yield member.name, NpzTensor(member, stats)
