"""Zip-format ``.bin`` files (``torch.save`` since 1.6): the pickle unpickled safely, storages read by record.

``torch.load(mmap=True)`` maps each storage at its record's offset without
asking whether the record is compressed or as long as its tensors, so a
repacked (DEFLATE) archive loaded compressed bytes as weights and a short
record read into the records after it. ``torch.load(mmap=False)`` inflates
and checks sizes, but reads every byte into fresh memory. This module does
what the second does, lazily:

- :mod:`.zip_records` locates and checks every record;
- ``data.pkl`` goes through torch's weights-only unpickler (the one
  ``torch.load(weights_only=True)`` uses, so the same pickles are refused) with
  a ``persistent_load`` that hands out *meta* storages: the pickle's tensors
  come back with their dtype, shape, strides and storage offset, no data;
- each storage record must hold exactly the bytes its storage declares
  (``torch.load``'s ``record size ... does not match expected size``);
- a row-major tensor in a stored, little-endian record becomes a
  :class:`~.tensor.SafetensorsTensor` over its bytes: narrowed before it is read,
  read with positioned reads, mappable into a parameter; anything else (deflated
  records, strided views, big-endian files, dtypes safetensors lacks) is read
  whole, inflated, byte-swapped as torch does, into memory.
"""

from __future__ import annotations

import io
import pickle
import re
from collections.abc import Mapping
from typing import Any, BinaryIO

import attrs
import torch

from loader.checkpoint import SAFETENSORS_DTYPES as DTYPES
from loader.checkpoint import SafetensorsDType, SafetensorsTensorInfo
from loader.errors import CheckpointFormatError, LoadError, UnsupportedError
from loader.weights import ReadStats

from .file_access import SharedDescriptor
from .tensor import SafetensorsTensor
from .zip_records import ZipRecord, read_record, read_zip_records

__all__ = ["load_zip_checkpoint"]

_MIN_VERSION, _MAX_VERSION = 1, 10
"""The archive versions torch 2.13's reader accepts (caffe2/serialize/versions.h)."""

_BY_TORCH_DTYPE: dict[Any, SafetensorsDType] = {getattr(torch, d.torch_name, None): d for d in DTYPES.values()}


@attrs.define
class _Storage:
    """A storage the pickle names: its record and the meta storage standing in for its data."""

    key: str
    dtype: torch.dtype
    record: ZipRecord
    meta: torch.UntypedStorage
    cpu: torch.UntypedStorage | None = None


class _Archive:
    """One open archive: its records, byte order and the storages its pickle named so far."""

    def __init__(self, path: str, fh: BinaryIO) -> None:
        self.path = path
        self.fh = fh
        self.records = read_zip_records(path, fh)
        first = next(iter(self.records), "")
        self.prefix = first.split("/", 1)[0]
        pickled = self.records.get(f"{self.prefix}/data.pkl")
        if pickled is None:
            raise CheckpointFormatError(f"{path}: the zip archive has no '{self.prefix}/data.pkl' record")
        self.pickled = pickled
        self._check_version()
        self.big_endian = self._big_endian()
        self.storages: dict[str, _Storage] = {}
        self.by_meta: dict[int, _Storage] = {}

    def _check_version(self) -> None:
        """torch's reader needs the archive's format version (``version`` or ``.data/version``), 1 to 10."""
        record = self.records.get(f"{self.prefix}/.data/version") or self.records.get(f"{self.prefix}/version")
        if record is None:
            raise CheckpointFormatError(f"{self.path}: the zip archive has no '{self.prefix}/version' record")
        text = read_record(self.path, self.fh, record) if record.size <= 32 else b""
        number = re.match(rb"\s*(\d+)", text[:32])  # what C++'s stoull, torch's parser, accepts
        if number is None or not _MIN_VERSION <= int(number.group(1)) <= _MAX_VERSION:
            raise UnsupportedError(f"{self.path}: record {record.name!r} holds archive version {text[:32]!r}; "
                                   f"expected an integer from {_MIN_VERSION} to {_MAX_VERSION}")
        alignment = self.records.get(f"{self.prefix}/.storage_alignment")
        text = read_record(self.path, self.fh, alignment) if alignment is not None and alignment.size <= 32 else b"64"
        if not re.fullmatch(rb"\s*[+-]?\d+\s*", text):  # torch.load reads it with int(), or refuses the file
            raise CheckpointFormatError(f"{self.path}: record '{self.prefix}/.storage_alignment' holds "
                                        f"{text[:32]!r}, expected an integer")

    def _big_endian(self) -> bool:
        record = self.records.get(f"{self.prefix}/byteorder")
        if record is None:
            return False  # torch's default for files without the mark
        order = read_record(self.path, self.fh, record) if record.size <= 16 else b"?"
        if order not in (b"little", b"big"):
            raise CheckpointFormatError(f"{self.path}: record {record.name!r} holds {order!r}, expected little or big")
        return order == b"big"

    def persistent_load(self, saved_id: Any) -> torch.storage.TypedStorage:
        """The meta storage for one pickled ``('storage', type, key, location, numel)`` reference."""
        if not (isinstance(saved_id, tuple) and len(saved_id) == 5 and saved_id[0] in ("storage", b"storage")):
            raise CheckpointFormatError(f"{self.path}: the pickle holds a persistent id {saved_id!r:.80}, "
                                        "expected ('storage', type, key, location, numel)")
        _, storage_type, key, _, numel = saved_id
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else getattr(storage_type, "dtype", None)
        if not isinstance(dtype, torch.dtype) or not isinstance(key, str) or type(numel) is not int or numel < 0:
            raise CheckpointFormatError(f"{self.path}: the pickle names a storage as {saved_id!r:.120}, "
                                        "expected a storage type, a string key and a count")
        known = self.storages.get(key)
        if known is None:
            known = self._storage(key, dtype, numel)
        return torch.storage.TypedStorage(wrap_storage=known.meta, dtype=dtype, _internal=True)

    def _storage(self, key: str, dtype: torch.dtype, numel: int) -> _Storage:
        name = f"{self.prefix}/data/{key}"
        record = self.records.get(name)
        if record is None:
            raise CheckpointFormatError(f"{self.path}: the pickle names storage {key!r}, but the archive "
                                        f"has no record {name!r}")
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if record.size != nbytes:
            raise CheckpointFormatError(
                f"{self.path}: storage record {name!r} holds {record.size} bytes, but its storage needs "
                f"{nbytes} ({numel} {str(dtype).removeprefix('torch.')} elements); the file is damaged"
            )
        storage = _Storage(key, dtype, record, torch.UntypedStorage(nbytes, device="meta"))
        self.storages[key] = storage
        self.by_meta[id(storage.meta)] = storage
        return storage

    def unpickle(self) -> Any:
        """The pickled structure, tensors on the meta device; code-running pickles refused as torch does."""
        from torch import _weights_only_unpickler  # what torch.load(weights_only=True) unpickles with

        data = read_record(self.path, self.fh, self.pickled)
        unpickler = _weights_only_unpickler.Unpickler(io.BytesIO(data), encoding="utf-8")
        unpickler.persistent_load = self.persistent_load  # type: ignore[method-assign]
        try:
            return unpickler.load()
        except LoadError:
            raise
        except pickle.UnpicklingError:
            raise  # pickle_format words the refusal
        except Exception as exc:  # the pickle is untrusted bytecode: whatever it makes the unpickler raise
            raise pickle.UnpicklingError(f"{type(exc).__name__}: {exc}") from exc

    def handle(self, name: str, tensor: torch.Tensor, descriptor: SharedDescriptor,
               stats: ReadStats | None) -> SafetensorsTensor | torch.Tensor:
        """A lazy handle for one unpickled tensor, or the tensor read into memory."""
        if tensor.device.type != "meta":
            return tensor  # rebuilt from plain data in the pickle (a numpy array), already in memory
        plain = tensor.layout == torch.strided and not tensor.is_quantized  # before touching its storage
        storage = self.by_meta.get(id(tensor.untyped_storage())) if plain else None
        if storage is None:
            raise CheckpointFormatError(f"{self.path}: entry {name!r} is not a plain dense tensor "
                                        f"(layout {tensor.layout}, dtype {tensor.dtype})")
        itemsize = tensor.element_size()
        extent = tensor.storage_offset() + sum((s - 1) * st for s, st in zip(tensor.shape, tensor.stride(),
                                                                            strict=True)) + 1
        if tensor.numel() and extent * itemsize > storage.record.size:
            raise CheckpointFormatError(
                f"{self.path}: tensor {name!r} needs {extent * itemsize} bytes of storage record "
                f"{storage.record.name!r}, which holds {storage.record.size}"
            )
        code = _BY_TORCH_DTYPE.get(tensor.dtype)
        if storage.record.stored and not self.big_endian and code is not None and tensor.is_contiguous():
            begin = storage.record.data_offset + int(tensor.storage_offset()) * itemsize
            info = SafetensorsTensorInfo(name, code, tuple(tensor.shape), begin, begin + int(tensor.numel()) * itemsize)
            return SafetensorsTensor(descriptor, info, stats)
        values = torch.empty(0, dtype=tensor.dtype)
        return values.set_(self._in_memory(storage), tensor.storage_offset(), tensor.shape, tensor.stride())

    def _in_memory(self, storage: _Storage) -> torch.UntypedStorage:
        if storage.cpu is None:
            data = bytearray(read_record(self.path, self.fh, storage.record))
            cpu = torch.frombuffer(data, dtype=torch.uint8).untyped_storage() if data else torch.UntypedStorage(0)
            storage.cpu = cpu
            if self.big_endian:
                storage.cpu.byteswap(storage.dtype)
        return storage.cpu


def load_zip_checkpoint(path: str, stats: ReadStats | None = None) -> tuple[Any, SharedDescriptor]:
    """Unpickle a zip-format ``.bin`` safely; tensors become lazy handles (or in-memory tensors).

    Returns the unpickled object (a state dict for a checkpoint) and the file's
    descriptor, which the caller holds while it reads.

    :raises CheckpointFormatError: if a record is damaged, compressed otherwise than torch allows, or shorter
        or longer than the storage the pickle declares.
    :raises pickle.UnpicklingError: if the pickle is refused by the weights-only unpickler.
    """
    descriptor = SharedDescriptor(path)
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; records are read with pread on its descriptor
    except OSError as exc:
        raise CheckpointFormatError(f"{path}: cannot open: {exc.strerror or exc}") from exc
    with fh:
        archive = _Archive(path, fh)
        loaded = archive.unpickle()
        if not isinstance(loaded, Mapping):
            return loaded, descriptor
        return {name: archive.handle(name, value, descriptor, stats) if isinstance(value, torch.Tensor) else value
                for name, value in loaded.items()}, descriptor
