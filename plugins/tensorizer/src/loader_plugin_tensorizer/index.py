"""The index at the head of a ``.tensors`` file: every tensor's name, dtype, shape and where its bytes lie.

tensorizer writes a file as ``|TZR|``, a fixed file header (data version,
feature flags, tensor count), a metadata block listing each tensor with the
absolute offsets of its header and data, then the tensors. This parser reads
the first two parts only, through any ranged reader (a local file, an S3
object, an HTTP URL), so a load can tell what a file holds, whether it is
encrypted, and which bytes each tensor occupies without fetching a value:
that is what lets a rank read only its own rows and ``loader inspect`` read
only the head of a remote file. Every field is checked against the file's
size, so a truncated or corrupt file is refused by name before anything else.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from loader.errors import CheckpointFormatError

if TYPE_CHECKING:
    import torch

__all__ = ["BUFFER", "MAGIC", "PARAM", "TensorEntry", "TensorizedIndex", "read_index"]

MAGIC = b"|TZR|"
PARAM = 0
BUFFER = 1
_FILE_HEADER = struct.Struct("<I32sQ8xQ")  # data version, feature flags, tensor bytes, (unused), tensor count
_LOCATION = struct.Struct("<QQQ")  # tensor header offset, data offset, data length
_ENCRYPTION_VERSION = 3
_FLAG_ENCRYPTED = 1
_FLAG_VERSIONED = 2
_LONG_SHAPES_VERSION = 5
_SUPPORTED_VERSIONS = (1, 2, 3, 4, 5)
_OPAQUE_SEPARATOR = "\0"
MAX_INDEX_BYTES = 256 * 2**20

ByteReader = Callable[[int, int], bytes]
"""``read(begin, length)``: up to ``length`` bytes from ``begin`` (fewer only at the end of the file)."""


@attrs.frozen
class TensorEntry:
    """One tensor as the index lists it."""

    name: str
    kind: int
    """tensorizer's tensor type: :data:`PARAM`, :data:`BUFFER` (module state such as rotary tables, written by
    ``write_module``) or a ``write_state_dict`` entry."""
    dtype_code: str
    """tensorizer's dtype string: a NumPy one (``<f4``), or ``<V2\\0torch.bfloat16`` for dtypes NumPy lacks."""
    shape: tuple[int, ...]
    data_offset: int
    data_length: int

    @property
    def torch_dtype(self) -> torch.dtype:
        """The tensor's torch dtype, from tensorizer's dtype string."""
        import numpy
        import torch

        numpy_code, _, torch_name = self.dtype_code.partition(_OPAQUE_SEPARATOR)
        if torch_name:
            dtype = getattr(torch, torch_name.removeprefix("torch."), None)
            if not isinstance(dtype, torch.dtype):
                raise CheckpointFormatError(f"tensor {self.name!r}: unknown dtype {torch_name!r}")
            return dtype
        try:
            return torch.from_numpy(numpy.empty(0, dtype=numpy.dtype(numpy_code))).dtype
        except (TypeError, ValueError) as exc:
            raise CheckpointFormatError(f"tensor {self.name!r}: unsupported dtype {numpy_code!r}") from exc


@attrs.frozen
class TensorizedIndex:
    """A file's index: its data version, whether its tensors are encrypted, and its tensors in file order."""

    file: str
    version: int
    encrypted: bool
    entries: tuple[TensorEntry, ...]

    def without_buffers(self) -> TensorizedIndex:
        """The index less its module buffers: what a checkpoint holds of a model written with ``write_module``."""
        kept = tuple(entry for entry in self.entries if entry.kind != BUFFER)
        return attrs.evolve(self, entries=kept)


def _exactly(read: ByteReader, begin: int, length: int, file: str, what: str) -> bytes:
    data = read(begin, length)
    if len(data) != length:
        raise CheckpointFormatError(f"{file}: truncated: the file ends inside its {what} "
                                    f"(needed {length} bytes at offset {begin}, got {len(data)})")
    return data


class _Cursor:
    """Reads the fields of the metadata block in order, naming the field a short block cuts off."""

    def __init__(self, data: bytes, file: str) -> None:
        self.data = data
        self.file = file
        self.at = 0

    def take(self, length: int, what: str) -> bytes:
        if self.at + length > len(self.data):
            raise CheckpointFormatError(f"{self.file}: corrupt tensor index: {what} runs past its end")
        chunk = self.data[self.at:self.at + length]
        self.at += length
        return chunk

    def unpack(self, fmt: str, what: str) -> tuple[int, ...]:
        layout = struct.Struct("<" + fmt)
        return layout.unpack(self.take(layout.size, what))


def _entry(cursor: _Cursor, versioned: bool) -> TensorEntry:
    long_shapes = False
    if versioned:
        (version,) = cursor.unpack("I", "an entry's version")
        long_shapes = version >= _LONG_SHAPES_VERSION
    (name_length,) = cursor.unpack("H", "a name's length")
    name = cursor.take(name_length, "a name").decode("utf-8", "replace")
    (kind,) = cursor.unpack("B", f"{name!r}'s type")
    (dtype_length,) = cursor.unpack("B", f"{name!r}'s dtype")
    dtype = cursor.take(dtype_length, f"{name!r}'s dtype").decode("utf-8", "replace")
    (ndim,) = cursor.unpack("B", f"{name!r}'s shape")
    shape = cursor.unpack(("Q" if long_shapes else "I") * ndim, f"{name!r}'s shape")
    _, data_offset, data_length = cursor.unpack("QQQ", f"{name!r}'s location")
    return TensorEntry(name, kind, dtype, tuple(shape), data_offset, data_length)


def read_index(read: ByteReader, file: str, size: int) -> TensorizedIndex:
    """Parse the file header and the tensor index of a ``.tensors`` file of ``size`` bytes.

    :raises CheckpointFormatError: not a tensorizer file, an unknown data version, or a truncated or corrupt
        index, or a tensor whose bytes lie past the end of the file (named).
    """
    head = _exactly(read, 0, len(MAGIC) + _FILE_HEADER.size + 8, file, "file header")
    if head[:len(MAGIC)] != MAGIC:
        raise CheckpointFormatError(f"{file}: not a tensorizer file (it does not start with {MAGIC!r})")
    version, flag_bytes, _, count = _FILE_HEADER.unpack_from(head, len(MAGIC))
    if version not in _SUPPORTED_VERSIONS:
        raise CheckpointFormatError(f"{file}: tensorizer data version {version} is not supported "
                                    f"(supported: {', '.join(map(str, _SUPPORTED_VERSIONS))})")
    flags = int.from_bytes(flag_bytes, "little")
    (index_length,) = struct.unpack_from("<Q", head, len(MAGIC) + _FILE_HEADER.size)
    if index_length > MAX_INDEX_BYTES:
        raise CheckpointFormatError(f"{file}: tensor index of {index_length} bytes is larger than "
                                    f"{MAX_INDEX_BYTES} (corrupt file?)")
    cursor = _Cursor(_exactly(read, len(head), index_length, file, "tensor index"), file)
    entries = tuple(_entry(cursor, bool(flags & _FLAG_VERSIONED)) for _ in range(count))
    for entry in entries:
        if entry.data_offset + entry.data_length > size:
            raise CheckpointFormatError(
                f"{file}: truncated: tensor {entry.name!r} needs bytes up to {entry.data_offset + entry.data_length}"
                f" but the file has {size}"
            )
    encrypted = version == _ENCRYPTION_VERSION or (version > _ENCRYPTION_VERSION and bool(flags & _FLAG_ENCRYPTED))
    return TensorizedIndex(file=file, version=version, encrypted=encrypted, entries=entries)
