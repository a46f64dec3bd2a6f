"""Parse and strictly validate a safetensors header, without importing torch: the one parser.

The safetensors plugin (local files), the Run:ai plugin (``s3://`` objects and
``loader inspect``), the core's sharded-state reader and the Hub's headers-only
inspection all read headers here (public through :mod:`loader.checkpoint`),
so a header one of them refuses, every one refuses, with the same message.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes
of UTF-8 JSON mapping each tensor name to ``{"dtype", "shape",
"data_offsets": [begin, end]}`` (offsets relative to the end of the header),
an optional ``"__metadata__"`` object of strings, then the raw data. Every
check a reader relies on later (spans match shapes, nothing runs past the data,
no two tensors share bytes, no gaps or trailing bytes -- the reference reader's
rules) happens here, once, so reads can trust the offsets.
Each failure is a :class:`~loader.errors.CheckpointFormatError` naming the file
and, where there is one, the tensor.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from ._safetensors_dtypes import DTYPES, SUB_BYTE_CODES, SafetensorsDType
from .errors import CheckpointFormatError, UnsupportedError

__all__ = [
    "MAX_HEADER_BYTES",
    "METADATA_KEY",
    "RangeReader",
    "SafetensorsHeader",
    "SafetensorsTensorInfo",
    "parse_header",
    "read_file_header",
    "read_header",
]

MAX_HEADER_BYTES = 100_000_000
"""Headers larger than this are refused as absurd (the limit ``safetensors`` itself applies)."""

METADATA_KEY = "__metadata__"
_LENGTH_BYTES = 8


@attrs.frozen
class SafetensorsTensorInfo:
    """One header entry: where a tensor's bytes are and how to interpret them.

    ``begin``/``end`` are absolute file offsets (already shifted past the header).
    """

    name: str
    dtype: SafetensorsDType
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@attrs.frozen
class SafetensorsHeader:
    """A validated header: tensors in file order, the metadata, and the file's extent."""

    path: str
    file_size: int
    data_start: int
    metadata: Mapping[str, str] = attrs.field(eq=False)
    tensors: Mapping[str, SafetensorsTensorInfo] = attrs.field(eq=False)

    @property
    def data_size(self) -> int:
        return self.file_size - self.data_start


RangeReader = Callable[[int, int], bytes]
"""``read_range(start, length)``: up to ``length`` bytes of a file from ``start`` (a local file, an
object's ranged GET, an HTTP ``Range`` request)."""


def read_header(read_range: RangeReader, file_size: int, name: str) -> SafetensorsHeader:
    """Read and validate the header of a file of ``file_size`` bytes through ``read_range``.

    Exactly two reads: the 8-byte length, then the header itself, so a remote
    file costs two small requests and never a byte of tensor data.

    :param read_range: reads ``length`` bytes from ``start`` (fewer only where the file ends).
    :param file_size: the whole file's size (a listing's, a ``stat``'s); the tensors must cover
        exactly the bytes after the header.
    :param name: how every error names the file.
    :raises CheckpointFormatError: if the header is malformed.
    """
    if file_size < _LENGTH_BYTES:
        raise CheckpointFormatError(
            f"{name}: file is {file_size} bytes, too short for a safetensors file "
            "(expected an 8-byte header length first)"
        )
    length = int.from_bytes(_read_exact(read_range, 0, _LENGTH_BYTES, name), "little")
    if length > MAX_HEADER_BYTES:
        raise CheckpointFormatError(
            f"{name}: header length {length} is more than the {MAX_HEADER_BYTES} bytes allowed; "
            "this is not a safetensors file"
        )
    if _LENGTH_BYTES + length > file_size:
        raise CheckpointFormatError(
            f"{name}: header length {length} runs past the end of the file ({file_size} bytes); "
            "the file is truncated or not a safetensors file"
        )
    return parse_header(_read_exact(read_range, _LENGTH_BYTES, length, name), name, file_size)


def read_file_header(path: str | os.PathLike[str], fd: int | None = None) -> SafetensorsHeader:
    """Read and validate the header of the local safetensors file at ``path``.

    :param path: the file; named in every error.
    :param fd: an already open descriptor of the same file, to avoid a second open.
    :raises CheckpointFormatError: if the file cannot be read or its header is malformed.
    """
    name = os.fspath(path)
    if fd is None:
        try:
            own = os.open(name, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise CheckpointFormatError(f"{name}: cannot open: {exc.strerror or exc}") from exc
        try:
            return read_file_header(name, own)
        finally:
            os.close(own)
    try:
        return read_header(lambda start, length: os.pread(fd, length, start), os.fstat(fd).st_size, name)
    except OSError as exc:
        raise CheckpointFormatError(f"{name}: cannot read the header: {exc.strerror or exc}") from exc


def _read_exact(read_range: RangeReader, start: int, count: int, name: str) -> bytes:
    """``count`` bytes from ``start``, asking again after a short read; the file ending first is an error."""
    parts = []
    while count:
        chunk = read_range(start, count)
        if not chunk:
            raise CheckpointFormatError(f"{name}: file ended while reading the header")
        chunk = chunk[:count]
        parts.append(chunk)
        count -= len(chunk)
        start += len(chunk)
    return b"".join(parts)


class _Pairs:
    """A JSON object kept as its key/value pairs, so repeated keys are seen, not silently merged."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs

    def to_dict(self, where: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in self.pairs:
            if key in out:
                raise CheckpointFormatError(f"{where}: key {key!r} appears twice")
            out[key] = value
        return out

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in self.pairs) + "}"


def parse_header(raw: bytes, name: str, file_size: int) -> SafetensorsHeader:
    """Validate the JSON header bytes ``raw`` of a file of ``file_size`` bytes named ``name``."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointFormatError(
            f"{name}: header is not UTF-8 ({exc.reason} at byte {exc.start})"
        ) from exc
    try:
        decoded = json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(
            f"{name}: header is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from exc
    except (ValueError, RecursionError) as exc:  # a number too long to convert, nesting too deep
        raise CheckpointFormatError(f"{name}: header is not valid JSON ({exc})") from exc
    if not isinstance(decoded, _Pairs):
        raise CheckpointFormatError(
            f"{name}: header must be a JSON object of tensors, found {_json_type(decoded)}"
        )
    entries: dict[str, Any] = {}
    for key, value in decoded.pairs:
        if key in entries:
            label = key if key == METADATA_KEY else f"tensor {key!r}"
            raise CheckpointFormatError(f"{name}: {label} appears twice in the header")
        entries[key] = value
    data_start = _LENGTH_BYTES + len(raw)
    data_size = file_size - data_start
    metadata = _metadata(entries.pop(METADATA_KEY, _Pairs([])), name)
    infos = [_tensor_info(key, entry, name, data_start, data_size) for key, entry in entries.items()]
    infos.sort(key=lambda t: (t.begin, t.end))
    _check_contiguous(infos, name, data_start, file_size)
    return SafetensorsHeader(
        path=name, file_size=file_size, data_start=data_start, metadata=metadata,
        tensors={info.name: info for info in infos},
    )


def _check_contiguous(infos: list[SafetensorsTensorInfo], name: str, data_start: int, file_size: int) -> None:
    """The reference reader's layout rule (``Metadata::validate``): sorted by offsets, the tensors
    cover the data exactly -- each begins where the previous ended (empty ones included), the
    first at the start of the data, the last at the end of the file. So no two tensors share a
    byte, and no bytes hide in gaps or after the last tensor.
    """
    previous: SafetensorsTensorInfo | None = None
    end = data_start
    for info in infos:
        if info.begin < end:
            assert previous is not None
            raise CheckpointFormatError(
                f"{name}: tensors {previous.name!r} (data_offsets {_rel(previous, data_start)}) and "
                f"{info.name!r} (data_offsets {_rel(info, data_start)}) overlap"
            )
        if info.begin > end:
            after = f"tensor {previous.name!r} ends at {end - data_start}" if previous else "the data starts at 0"
            raise CheckpointFormatError(
                f"{name}: tensor {info.name!r} starts at {info.begin - data_start}, but {after}: a gap of "
                f"{info.begin - end} bytes; safetensors requires the tensors to follow one another"
            )
        previous, end = info, info.end
    if end != file_size:
        raise CheckpointFormatError(
            f"{name}: the tensors cover {end - data_start} of the {file_size - data_start} bytes after the "
            "header; safetensors requires the data to be fully covered"
        )


def _rel(info: SafetensorsTensorInfo, data_start: int) -> list[int]:
    return [info.begin - data_start, info.end - data_start]


def _json_type(value: Any) -> str:
    """How an error names a decoded JSON value's type, in JSON's own words."""
    if isinstance(value, _Pairs):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _metadata(value: Any, name: str) -> dict[str, str]:
    if not isinstance(value, _Pairs):
        raise CheckpointFormatError(
            f"{name}: {METADATA_KEY} must be a JSON object of strings, found {_json_type(value)}"
        )
    metadata = value.to_dict(f"{name}: {METADATA_KEY}")
    for key, item in metadata.items():
        if not isinstance(item, str):
            raise CheckpointFormatError(
                f"{name}: {METADATA_KEY} must map strings to strings; key {key!r} holds {_json_type(item)}"
            )
    return metadata


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _tensor_info(tensor: str, entry: Any, name: str, data_start: int, data_size: int) -> SafetensorsTensorInfo:
    where = f"{name}: tensor {tensor!r}"
    if not isinstance(entry, _Pairs):
        raise CheckpointFormatError(
            f"{where}: header entry must be an object with dtype, shape and data_offsets, "
            f"found {_json_type(entry)}"
        )
    entry = entry.to_dict(where)
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise CheckpointFormatError(f"{where}: header entry lacks {key!r}")
    code = entry["dtype"]
    if isinstance(code, str) and code in SUB_BYTE_CODES:
        raise UnsupportedError(f"{where}: dtype {code} (packed sub-byte elements) is not supported")
    if not isinstance(code, str) or code not in DTYPES:
        raise CheckpointFormatError(
            f"{where}: unknown dtype {code!r} (expected one of {', '.join(DTYPES)})"
        )
    dtype = DTYPES[code]
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_int(s) and s >= 0 for s in shape):
        raise CheckpointFormatError(
            f"{where}: shape must be a list of non-negative integers, found {shape!r}"
        )
    offsets = entry["data_offsets"]
    if (
        not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise CheckpointFormatError(
            f"{where}: data_offsets must be [begin, end] integers with 0 <= begin <= end, found {offsets!r}"
        )
    begin, end = offsets
    numel = 1
    for s in shape:
        numel *= s
    expected = numel * dtype.itemsize
    if end - begin != expected:
        raise CheckpointFormatError(
            f"{where}: data_offsets {offsets} span {end - begin} bytes, but shape {shape} of "
            f"{code} needs {expected}"
        )
    if end > data_size:
        raise CheckpointFormatError(
            f"{where}: data_offsets {offsets} run past the end of the data "
            f"({data_size} bytes after the header)"
        )
    return SafetensorsTensorInfo(tensor, dtype, tuple(shape), data_start + begin, data_start + end)
