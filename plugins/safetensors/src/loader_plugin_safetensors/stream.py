"""The safetensors weight iterator: every tensor of every file, as unread handles.

Files are walked in the order given and each file's tensors in the order of
their bytes, so reads sweep every file forward. A file is held open only while
its tensors are being yielded; the generator's ``finally`` releases it even if
the consumer stops early. A tensor name may appear once per checkpoint: a
second file repeating a name is an error naming both files, raised as soon as
that file's header is read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from loader.errors import CheckpointFormatError
from loader.weights import ReadStats

from .checkpoint_file import open_checkpoint_file
from .tensor import SafetensorsTensor

__all__ = ["iter_safetensors_weights"]


def iter_safetensors_weights(
    files: Iterable[str], stats: ReadStats | None = None
) -> Iterator[tuple[str, SafetensorsTensor]]:
    """Yield ``(name, SafetensorsTensor)`` for each tensor of ``files``; nothing is read yet."""
    owner: dict[str, str] = {}
    for path in files:
        checkpoint = open_checkpoint_file(path, stats)
        for name in checkpoint.infos:
            first = owner.setdefault(name, checkpoint.path)
            if first != checkpoint.path:
                raise CheckpointFormatError(
                    f"tensor {name!r} appears in two files of one checkpoint: {first} and {checkpoint.path}"
                )
        checkpoint.hold()
        try:
            yield from checkpoint.tensors()
        finally:
            checkpoint.release()
