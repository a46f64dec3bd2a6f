"""The weight iterator: every tensor of the chosen ``.tensors`` files, by the cheapest reader that can.

Each file's index is read first (:mod:`.index`), so a file that is not
tensorizer's, is truncated, or is encrypted with no key given is refused by
name before any tensor is read. Then:

- a plain file, no hash check: :class:`~.plain_tensor.PlainTensor` handles that read straight into the
  parameters — a local file by positioned reads (each rank only its rows, or mapped), a remote one through
  one ranged stream from byte 0 that serves the index too (:mod:`.remote_stream`);
- ``loader inspect`` (headers only): handles built from the index, nothing fetched;
- anything else (encrypted, ``verify_hash``, a remote file with ``num_readers`` given): tensorizer's
  deserializer (:mod:`.deserialized`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence

from loader.checkpoint import SAFETENSORS_DTYPES
from loader.errors import CheckpointFormatError
from loader.weights import CheckpointTensor, HeaderOnlyTensor, ReadStats

from .deserialized import iter_deserialized
from .errors import DecryptionError
from .formats import is_remote
from .index import TensorizedIndex, read_index
from .options import TensorizerOptions
from .plain_tensor import ByteSource, LocalFile, PlainTensor
from .remote import RemoteFile
from .remote_stream import RemoteStream

__all__ = ["iter_tensorized", "open_index"]


def _size(uri: str, size: Callable[[], int]) -> int:
    """``size()`` of the remote file ``uri``, a missing file named."""
    try:
        return size()
    except FileNotFoundError as exc:
        raise CheckpointFormatError(f"{uri}: no such file") from exc


def open_index(file: str, options: TensorizerOptions) -> TensorizedIndex:
    """The index of a local or remote ``.tensors`` file (a remote one by ranged reads of its head)."""
    if is_remote(file):
        remote = RemoteFile(file, options)
        return read_index(remote.read, file, _size(file, remote.size))
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


def _plain(index: TensorizedIndex, source: ByteSource, stats: ReadStats) -> Iterator[tuple[str, CheckpointTensor]]:
    for entry in index.entries:
        yield entry.name, PlainTensor(source, entry, entry.torch_dtype, stats)


def _open(file: str, options: TensorizerOptions, headers_only: bool) -> tuple[TensorizedIndex, ByteSource | None]:
    """The file's index and where its plain bytes are read from (``None``: the deserializer reads it)."""
    deserialized = options.verify_hash or (is_remote(file) and options.num_readers is not None)
    if not is_remote(file) or headers_only or deserialized:
        index = open_index(file, options)
        plain = not (index.encrypted or deserialized or is_remote(file))
        return index, LocalFile(file) if plain else None
    stream = RemoteStream(file, options)
    try:
        index = read_index(stream.read, file, _size(file, lambda: stream.size))
    except BaseException:
        stream.close()
        raise
    if index.encrypted:
        stream.close()
        return index, None
    return index, stream


def iter_tensorized(files: Sequence[str], options: TensorizerOptions, stats: ReadStats, *, headers_only: bool = False,
                    parameter_names: bool = False) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield ``(name, handle)`` for every tensor of ``files``, each file's index checked before its tensors.

    Under checkpoint names, a file written from a module (``write_module``) also holds the module's buffers
    (rotary ``inv_freq`` tables); they are module state the model rebuilds from its config, not weights, and
    are left out, as ``save_pretrained`` leaves them out of safetensors.
    """
    opened: list[tuple[TensorizedIndex, ByteSource | None]] = []
    try:
        for file in files:
            opened.append(_open(file, options, headers_only))
        for index, source in opened:
            if not parameter_names:
                index = index.without_buffers()
            if headers_only:
                yield from _headers(index)
                continue
            _check_key(index, options)
            if source is None:
                yield from iter_deserialized(index.file, index, options, stats)
            else:
                yield from _plain(index, source, stats)
    finally:
        for _, source in opened:
            if isinstance(source, RemoteStream):
                source.close()
