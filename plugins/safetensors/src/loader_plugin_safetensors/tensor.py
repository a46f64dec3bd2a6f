"""``SafetensorsTensor``: a checkpoint tensor that reads only the bytes its view needs.

A handle is a header entry plus a view — ``(start, length)`` per dim — so
``narrow`` is free and composes; a read turns the view into a
:class:`~.byte_layout.ByteLayout` (one range for a dim-0 narrow, a strided
grid for an inner-dim narrow) and :mod:`.tensor_read` moves exactly those
bytes, straight into the destination when it can. Importing this module does
not import torch; reading does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.checkpoint import SafetensorsTensorInfo
from loader.weights import CheckpointTensor, FileSpan, ReadStats

from .byte_layout import ByteLayout, layout_of
from .file_access import SharedDescriptor

if TYPE_CHECKING:
    import torch

__all__ = ["SafetensorsTensor"]


class SafetensorsTensor(CheckpointTensor):
    """One tensor of a safetensors file, narrowed lazily and read with positioned reads.

    :param descriptor: the file's shared descriptor (opened for a read if nobody holds it).
    :param info: the validated header entry.
    :param stats: where reads are counted, or ``None`` outside a load.
    :param view: ``(start, length)`` per dim; the whole tensor when omitted.
    """

    def __init__(
        self,
        descriptor: SharedDescriptor,
        info: SafetensorsTensorInfo,
        stats: ReadStats | None = None,
        view: tuple[tuple[int, int], ...] | None = None,
    ) -> None:
        self.descriptor = descriptor
        self.info = info
        self.stats = stats
        self.view = view if view is not None else tuple((0, s) for s in info.shape)
        self.name = info.name
        self.file = descriptor.path

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(length for _, length in self.view)

    @property
    def dtype(self) -> torch.dtype:
        return self.info.dtype.torch_dtype()

    @property
    def itemsize(self) -> int:
        return self.info.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.numel() * self.info.dtype.itemsize

    def layout(self) -> ByteLayout:
        """The file bytes this view needs (absolute offsets)."""
        return layout_of(self.info.begin, self.info.shape, self.info.dtype.itemsize, self.view)

    def file_span(self) -> FileSpan | None:
        """The view's bytes when they are one run (the whole tensor, or a narrow of its leading dims)."""
        layout = self.layout()
        if not layout.contiguous:
            return None
        return FileSpan(self.file, layout.offset, layout.nbytes, self.stats)

    def narrow(self, dim: int, start: int, length: int) -> SafetensorsTensor:
        dim = self.check_narrow(dim, start, length)
        base, _ = self.view[dim]
        view = (*self.view[:dim], (base + start, length), *self.view[dim + 1:])
        return SafetensorsTensor(self.descriptor, self.info, self.stats, view)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        import torch

        out = torch.empty(self.shape, dtype=dtype if dtype is not None else self.dtype)
        self.read_into(out)
        return out

    def read_into(self, out: torch.Tensor) -> None:
        self.check_destination(out)
        from .tensor_read import read_tensor_into

        read_tensor_into(self, out)
