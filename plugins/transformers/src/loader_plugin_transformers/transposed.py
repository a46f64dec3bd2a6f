"""A checkpoint tensor read transposed, still narrowed before it is read.

GPT-2-style ``Conv1D`` layers store their weight as ``(in, out)``; the loader's
linear layers hold ``(out, in)``. When the fallback swaps such a layer for a
loader layer (to quantize or shard it), its checkpoint tensor is wrapped here
so that a rank's narrow of rows becomes a narrow of the stored columns: only
this rank's bytes are read, then transposed in memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.weights import CheckpointTensor

if TYPE_CHECKING:
    import torch

__all__ = ["TransposedTensor", "WrappedTensor"]


class WrappedTensor(CheckpointTensor):
    """A checkpoint tensor whose values the fallback rewrites as transformers does: name, file, dtype, stored
    type, bytes and (unless a subclass changes it) shape are the wrapped tensor's; reads stay lazy."""

    def __init__(self, inner: CheckpointTensor) -> None:
        self.inner = inner
        self.name = inner.name
        self.file = inner.file

    @property
    def shape(self) -> tuple[int, ...]:
        return self.inner.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.inner.dtype

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    @property
    def stored_type(self) -> str:
        return self.inner.stored_type


class TransposedTensor(WrappedTensor):
    """The 2-D ``inner`` tensor seen as its transpose."""

    def __init__(self, inner: CheckpointTensor) -> None:
        if inner.ndim != 2:
            raise ValueError(f"{inner.describe()}: only a 2-D tensor can be transposed, found shape {inner.shape}")
        super().__init__(inner)

    @property
    def shape(self) -> tuple[int, ...]:
        rows, cols = self.inner.shape
        return (cols, rows)

    def describe(self) -> str:
        return f"{self.inner.describe()} (transposed from Conv1D's (in, out))"

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim = self.check_narrow(dim, start, length)
        return TransposedTensor(self.inner.narrow(1 - dim, start, length))

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.inner.read(dtype).t().contiguous()
