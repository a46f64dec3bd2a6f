"""A streamed checkpoint tensor: a header entry, narrowed for free, read by the streamer when asked.

Nothing is fetched when the stream yields a handle. A weight loader narrows it to
this rank's shard (a change to the byte ranges only) and reads it into the
parameter; :mod:`.tensor_reads` then asks the streamer for exactly those ranges
with the parameter's own memory as their destination. A handle may be kept and
read later, or read twice: every read fetches its bytes again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from loader.checkpoint import SafetensorsTensorInfo
from loader.weights import CheckpointTensor

from .ranges import ByteRanges, Narrow, byte_ranges

if TYPE_CHECKING:
    import torch

    from .tensor_reads import TensorReads

__all__ = ["StreamedSource", "StreamedTensor"]


@attrs.frozen
class StreamedSource:
    """One header entry of one file, and the session that reads it."""

    path: str
    """What the streamer reads: a local path or an object URI."""
    info: SafetensorsTensorInfo
    reads: TensorReads = attrs.field(eq=False, repr=False)


class StreamedTensor(CheckpointTensor):
    """A (possibly narrowed) handle on a :class:`StreamedSource`; narrowing reads nothing."""

    def __init__(self, source: StreamedSource, narrows: tuple[Narrow, ...] = ()) -> None:
        self.source = source
        self.narrows = narrows
        self.name = source.info.name
        self.file = source.path
        shape = list(source.info.shape)
        for dim, _, length in narrows:
            shape[dim] = length
        self._shape = tuple(shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self.source.info.dtype.torch_dtype()

    @property
    def stored_type(self) -> str:
        return self.source.info.dtype.torch_name

    @property
    def nbytes(self) -> int:
        return self.numel() * self.source.info.dtype.itemsize

    def ranges(self) -> ByteRanges:
        """The file bytes this handle's values are, in row-major order."""
        info = self.source.info
        return byte_ranges(info.begin, info.shape, info.dtype.itemsize, self.narrows)

    def narrow(self, dim: int, start: int, length: int) -> StreamedTensor:
        dim = self.check_narrow(dim, start, length)
        return StreamedTensor(self.source, (*self.narrows, (dim, start, length)))

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.source.reads.read(self, dtype)

    def read_into(self, out: torch.Tensor) -> None:
        self.check_destination(out)
        self.source.reads.read_into(self, out)
