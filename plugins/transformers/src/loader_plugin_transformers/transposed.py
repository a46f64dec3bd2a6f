"""A checkpoint tensor read transposed (or with its dims permuted), still narrowed before it is read.

GPT-2-style ``Conv1D`` layers store their weight as ``(in, out)``; the loader's
linear layers hold ``(out, in)``. When the fallback swaps such a layer for a
loader layer (to quantize or shard it), its checkpoint tensor is wrapped here
so that a rank's narrow of rows becomes a narrow of the stored columns: only
this rank's bytes are read, then transposed in memory. transformers' weight
conversions may transpose a tensor before it lands in a fused parameter
(``Transpose``); :class:`PermutedTensor` is that, for any number of dims.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.weights import CheckpointTensor

if TYPE_CHECKING:
    import torch

__all__ = ["PermutedTensor", "TransposedTensor", "WrappedTensor"]


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


class PermutedTensor(WrappedTensor):
    """``inner`` with its dims reordered: dim ``j`` of this tensor is dim ``dims[j]`` of ``inner``."""

    def __init__(self, inner: CheckpointTensor, dims: tuple[int, ...]) -> None:
        if sorted(dims) != list(range(inner.ndim)):
            raise ValueError(f"{inner.describe()}: {dims} is not a permutation of its {inner.ndim} dims")
        super().__init__(inner)
        self.dims = dims

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.inner.shape[d] for d in self.dims)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim = self.check_narrow(dim, start, length)
        return PermutedTensor(self.inner.narrow(self.dims[dim], start, length), self.dims)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.inner.read(dtype).permute(self.dims).contiguous()

    def read_into(self, out: torch.Tensor) -> None:
        if self.dims == tuple(range(len(self.dims))):  # nothing moves: the inner tensor's own (fast) read
            self.inner.read_into(out)
            return
        super().read_into(out)
