"""Tensors read by tensorizer's own ``TensorDeserializer``: encrypted files, verified hashes, chosen readers.

This is the path for everything the plain readers cannot take: an encrypted
file (it decrypts chunk by chunk with libsodium), a load that asked for
``verify_hash``, or a remote file loaded with ``num_readers`` (tensorizer
streams it through that many parallel ranged curl requests). Every rank
streams the whole file and its weight loaders keep their rows: decryption
and hash checks need a tensor's every byte.

The deserializer keeps every tensor it read until it is closed, so the file
is read in batches of at most :data:`BATCH_BYTES` (one deserializer each,
restricted by ``filter_func``): memory stays at one batch, not the model.
Its tensors are adopted, not copied: on the CPU it allocates a fresh buffer
per tensor and never writes to it again (only a CUDA target reuses a pinned
staging buffer, and copies out of it before yielding); a load always asks
for the CPU and the weight loaders copy into the parameters.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from loader.errors import CheckpointFormatError, LoadError
from loader.weights import EagerTensor, ReadStats

from .errors import DecryptionError, StorageAccessError
from .index import TensorizedIndex
from .keys import decryption_for
from .options import TensorizerOptions

if TYPE_CHECKING:
    import torch

__all__ = ["BATCH_BYTES", "batches", "iter_deserialized"]

BATCH_BYTES = 512 * 2**20


def batches(index: TensorizedIndex, budget: int) -> list[list[str]]:
    """The index's tensor names in file order, cut into runs of at most ``budget`` bytes (one tensor at least)."""
    runs: list[list[str]] = [[]]
    size = 0
    for entry in index.entries:
        if runs[-1] and size + entry.data_length > budget:
            runs.append([])
            size = 0
        runs[-1].append(entry.name)
        size += entry.data_length
    return [run for run in runs if run]


def _failure(file: str, options: TensorizerOptions, exc: BaseException) -> LoadError:
    """The error a user sees for what the deserializer raised."""
    from tensorizer.serialization import CryptographyError, HashMismatchError

    reason = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, CryptographyError):
        key = options.encryption_keyfile
        if key is None:
            return DecryptionError(f"{file}: is encrypted; pass its key file with the format option "
                                   "encryption_keyfile=PATH")
        return DecryptionError(f"{file}: decryption failed with the key in {key} (a key for another file?): "
                               f"{reason}")
    if isinstance(exc, HashMismatchError):
        return CheckpointFormatError(f"{file}: a tensor does not match its stored hash: {reason}")
    if file.startswith(("s3://", "http://", "https://")):
        return StorageAccessError(f"{file}: tensorizer could not stream the file: {reason}")
    return CheckpointFormatError(f"{file}: tensorizer could not read the file: {reason}")


def _open(file: str, options: TensorizerOptions) -> Any:
    from tensorizer import stream_io

    if file.startswith("s3://"):
        return stream_io.open_stream(file, "rb", **options.s3_arguments())
    return file


def _deserializer(file: str, names: set[str], options: TensorizerOptions) -> Any:
    from tensorizer import TensorDeserializer

    return TensorDeserializer(_open(file, options), device="cpu", filter_func=names.__contains__, lazy_load=True,
                              num_readers=options.num_readers, verify_hash=options.verify_hash,
                              encryption=decryption_for(options.encryption_keyfile))


def _batch(file: str, names: list[str], options: TensorizerOptions) -> Iterator[tuple[str, torch.Tensor]]:
    deserializer = _deserializer(file, set(names), options)
    try:
        for _, _, name, tensor in deserializer.read_tensors():
            yield str(name), tensor.data
    finally:
        deserializer.close()


def iter_deserialized(file: str, index: TensorizedIndex, options: TensorizerOptions, stats: ReadStats,
                      budget: int = BATCH_BYTES) -> Iterator[tuple[str, EagerTensor]]:
    """Every tensor of ``file``, batch by batch, each adopted as an :class:`~loader.weights.EagerTensor`."""
    for names in batches(index, budget):
        stream = _batch(file, names, options)
        while True:
            try:
                name, tensor = next(stream)
            except StopIteration:
                break
            except LoadError:
                raise
            except Exception as exc:
                raise _failure(file, options, exc) from exc
            stats.add(tensor.numel() * tensor.element_size(), 1)
            yield name, EagerTensor(tensor, name, file)

