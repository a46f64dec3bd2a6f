"""The weight iterator: every tensor of the chosen ``.tensors`` files, by the cheapest reader that can.

Each file's index is read first (:mod:`.index`), so a file that is not
tensorizer's, is truncated, or is encrypted with no key given is refused by
name before any tensor is read. Then:

- a plain local file, no hash check: :class:`~.local_tensor.LocalTensor` handles (each rank reads only its
  rows, or maps them);
- ``loader inspect`` (headers only): handles built from the index, nothing fetched;
- anything else (remote, encrypted, ``verify_hash``): tensorizer's deserializer (:mod:`.deserialized`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

from loader.checkpoint import SAFETENSORS_DTYPES
from loader.errors import CheckpointFormatError
from loader.weights import CheckpointTensor, HeaderOnlyTensor, ReadStats

from .deserialized import iter_deserialized
from .errors import DecryptionError
from .formats import is_remote
from .index import TensorizedIndex, read_index
from .local_tensor import LocalTensor
from .options import TensorizerOptions
from .remote import RemoteFile

__all__ = ["iter_tensorized", "open_index"]


def open_index(file: str, options: TensorizerOptions) -> TensorizedIndex:
    """The index of a local or remote ``.tensors`` file."""
    if is_remote(file):
        remote = RemoteFile(file, options)
        try:
            size = remote.size()
        except FileNotFoundError as exc:
            raise CheckpointFormatError(f"{file}: no such file") from exc
        return read_index(remote.read, file, size)
    try:
        fd = os.open(file, os.O_RDONLY)
    except FileNotFoundError as exc:
        raise CheckpointFormatError(f"{file}: no such file") from exc
    try:
        return read_index(lambda begin, length: os.pread(fd, length, begin), file, os.fstat(fd).st_size)
    finally:
        os.close(fd)


def _check_key(index: TensorizedIndex, options: TensorizerOptions) -> None:
    if index.encrypted and options.encryption_keyfile is None:
        raise DecryptionError(f"{index.file}: is encrypted; pass its key file with the format option "
                              "encryption_keyfile=PATH")
    if not index.encrypted and options.encryption_keyfile is not None:
        raise DecryptionError(f"{index.file}: is not encrypted, but the format option encryption_keyfile names "
                              f"a key ({options.encryption_keyfile}); drop it to load this file")


def _headers(index: TensorizedIndex) -> Iterator[tuple[str, CheckpointTensor]]:
    codes = {stored.torch_name: stored for stored in SAFETENSORS_DTYPES.values()}
    for entry in index.entries:
        stored = codes[str(entry.torch_dtype).removeprefix("torch.")]
        yield entry.name, HeaderOnlyTensor(entry.name, index.file, stored, entry.shape)


def _local(index: TensorizedIndex, stats: ReadStats) -> Iterator[tuple[str, CheckpointTensor]]:
    for entry in index.entries:
        yield entry.name, LocalTensor(index.file, entry, entry.torch_dtype, stats)


def iter_tensorized(files: Sequence[str], options: TensorizerOptions, stats: ReadStats, *, headers_only: bool = False,
                    parameter_names: bool = False) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield ``(name, handle)`` for every tensor of ``files``, each file's index checked before its tensors.

    Under checkpoint names, a file written from a module (``write_module``) also holds the module's buffers
    (rotary ``inv_freq`` tables); they are module state the model rebuilds from its config, not weights, and
    are left out, as ``save_pretrained`` leaves them out of safetensors.
    """
    indexes = [open_index(file, options) for file in files]
    if not parameter_names:
        indexes = [index.without_buffers() for index in indexes]
    for index in indexes:
        if headers_only:
            yield from _headers(index)
            continue
        _check_key(index, options)
        if is_remote(index.file) or index.encrypted or options.verify_hash:
            yield from iter_deserialized(index.file, index, options, stats)
        else:
            yield from _local(index, stats)
