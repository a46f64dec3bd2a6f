"""Checkpoint tensors that can be narrowed before their bytes are read.

A format plugin's iterator yields ``(name, CheckpointTensor)`` pairs rather than
torch tensors. The parameter's ``weight_loader`` narrows the handle to this
rank's shard (``narrow`` is free: it only changes the byte ranges to read) and
then asks it to ``read_into`` the parameter's storage. That is how a TP rank
reads only its own bytes, and how a fast format writes straight into the
parameter with no intermediate copy.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import attrs

from ._mapped_parameters import fill_parameter
from .errors import CheckpointFormatError, ShapeMismatchError

if TYPE_CHECKING:
    import torch

    from ._safetensors_dtypes import SafetensorsDType

__all__ = [
    "CheckpointTensor",
    "EagerTensor",
    "FileSpan",
    "HeaderOnlyTensor",
    "ReadStats",
    "RowPermutedTensor",
    "WeightStream",
    "check_shape",
    "fill_parameter",
    "interleaved_to_half_rotary",
]


@attrs.define
class ReadStats:
    """Bytes read from storage during one load; formats add to it as they read.

    Thread-safe, since fast readers read from several threads at once.
    """

    bytes_read: int = 0
    tensors_read: int = 0
    bytes_mapped: int = 0
    """Of ``bytes_read``, those that became parameter storage by mapping the file (no copy)."""
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False, eq=False)

    def add(self, nbytes: int, tensors: int = 0, *, mapped: int = 0) -> None:
        """Count ``nbytes`` taken from storage, ``tensors`` finished, and of the bytes ``mapped`` (not copied)."""
        with self._lock:
            self.bytes_read += nbytes
            self.tensors_read += tensors
            self.bytes_mapped += mapped


@attrs.frozen
class FileSpan:
    """Where a tensor's values lie in a file, byte for byte as a contiguous torch tensor holds them.

    A format returns one from :meth:`CheckpointTensor.file_span` when the
    (narrowed) values are a single run of bytes in the file, stored in
    :attr:`CheckpointTensor.dtype` in row-major order, little-endian. The core
    can then make a CPU parameter's pages *be* the file's page cache instead
    of copying (see :func:`fill_parameter`).
    """

    path: str
    offset: int
    """Absolute offset of the first byte in the file."""
    nbytes: int
    stats: ReadStats | None = attrs.field(default=None, eq=False)
    """Where the mapped bytes are counted, like the format's own reads."""


def check_shape(loaded: CheckpointTensor, expected: Sequence[int], what: str = "") -> None:
    """Raise :class:`~loader.errors.ShapeMismatchError` unless ``loaded`` has shape ``expected``.

    ``what`` names the destination (a layer prefix, a shard) in the message.
    """
    expected = tuple(int(s) for s in expected)
    if tuple(loaded.shape) != expected:
        target = f" for {what}" if what else ""
        raise ShapeMismatchError(
            f"{loaded.describe()}: expected shape {expected}{target}, found {tuple(loaded.shape)}"
        )


class CheckpointTensor(abc.ABC):
    """One tensor of a checkpoint, not read yet.

    Subclasses implement :attr:`shape`, :attr:`dtype`, :meth:`narrow` and
    :meth:`read`; fast formats also override :meth:`read_into`. ``name`` and
    ``file`` are kept for error messages.
    """

    name: str
    file: str

    @property
    @abc.abstractmethod
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the values (after any narrowing)."""

    @property
    @abc.abstractmethod
    def dtype(self) -> torch.dtype:
        """The dtype :meth:`read` returns when no dtype is asked for."""

    @abc.abstractmethod
    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        """Return a handle on ``[start, start + length)`` along ``dim``; reads nothing."""

    @abc.abstractmethod
    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Read the values into a new contiguous CPU tensor (converted to ``dtype``)."""

    @property
    def nbytes(self) -> int:
        """Bytes a read costs in storage; formats with packed blocks override it."""
        import torch

        n = 1
        for s in self.shape:
            n *= s
        return n * torch.empty((), dtype=self.dtype).element_size()

    @property
    def stored_type(self) -> str:
        """How the values are stored (``bfloat16``, ``Q4_K``, ...), for ``loader inspect``."""
        return str(self.dtype).removeprefix("torch.")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def describe(self) -> str:
        """``'name' in file`` — how error messages refer to this tensor."""
        return f"tensor {self.name!r} in {self.file}"

    def check_destination(self, out: torch.Tensor) -> None:
        """Raise :class:`~loader.errors.ShapeMismatchError` unless ``out`` has this tensor's shape, and
        :class:`~loader.errors.CheckpointFormatError` for complex values into a real ``out``: torch's copy
        would keep the real parts only (with a warning), a silently different weight."""
        check_shape(self, out.shape)
        if self.dtype.is_complex and not out.dtype.is_complex:
            raise CheckpointFormatError(
                f"{self.describe()} holds complex values ({str(self.dtype).removeprefix('torch.')}); reading "
                f"them into {str(out.dtype).removeprefix('torch.')} would drop their imaginary part"
            )

    def file_span(self) -> FileSpan | None:
        """The values as one run of file bytes in :attr:`dtype`, or ``None`` (the default).

        Formats whose stored bytes are exactly the tensor (safetensors, a
        dim-0 narrow of it) override this so CPU loads can map instead of
        copy; anything converted, packed, permuted or strided returns ``None``.
        """
        return None

    def read_into(self, out: torch.Tensor) -> None:
        """Write the values into ``out`` (same shape, any dtype, any device)."""
        self.check_destination(out)
        values = self.read(out.dtype if out.device.type == "cpu" else None)
        out.copy_(values)

    def check_narrow(self, dim: int, start: int, length: int) -> int:
        """Validate a :meth:`narrow` request against :attr:`shape`; return ``dim`` made non-negative.

        Every :meth:`narrow` implementation calls this first: a dim out of
        range or a slice outside the dimension raises
        :class:`~loader.errors.CheckpointFormatError` naming the tensor.
        """

        nd = len(self.shape)
        if not -nd <= dim < nd:
            raise CheckpointFormatError(f"{self.describe()}: cannot narrow dim {dim} of shape {self.shape}")
        dim %= nd
        if start < 0 or length < 0 or start + length > self.shape[dim]:
            raise CheckpointFormatError(
                f"{self.describe()}: slice [{start}, {start + length}) is outside dim {dim} "
                f"of size {self.shape[dim]}"
            )
        return dim

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, shape={self.shape}, dtype={self.dtype})"


WeightStream = Iterator[tuple[str, CheckpointTensor]]
"""What a format's iterator yields: checkpoint names with unread tensors."""


class EagerTensor(CheckpointTensor):
    """A tensor already in memory, dressed as a checkpoint tensor.

    Used by formats that can only read whole tensors (pickled ``.bin``) and by
    tests. ``narrow`` is a view, so nothing is copied until ``read``.
    """

    def __init__(self, tensor: torch.Tensor, name: str = "<memory>", file: str = "<memory>") -> None:
        self.tensor = tensor
        self.name = name
        self.file = file

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    def narrow(self, dim: int, start: int, length: int) -> EagerTensor:
        dim = self.check_narrow(dim, start, length)
        return EagerTensor(self.tensor.narrow(dim, start, length), self.name, self.file)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = self.tensor if dtype is None else self.tensor.to(dtype)
        if t is self.tensor:
            t = t.clone()
        return t.contiguous()

    def read_into(self, out: torch.Tensor) -> None:
        import torch

        self.check_destination(out)
        with torch.no_grad():
            out.detach().copy_(self.tensor)


class HeaderOnlyTensor(CheckpointTensor):
    """A tensor known from a header only (its name, dtype and shape); its values were not fetched.

    What a stream built for ``loader inspect`` (``options.headers_only``) yields, for remote
    files whose bytes it must not download (``s3://`` objects, Hub files). Narrowing works;
    reading raises.
    """

    def __init__(self, name: str, file: str, stored: SafetensorsDType, shape: tuple[int, ...]) -> None:
        self.name = name
        self.file = file
        self.stored = stored
        self._shape = shape

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self.stored.torch_dtype()

    @property
    def stored_type(self) -> str:
        return self.stored.torch_name

    @property
    def nbytes(self) -> int:
        return self.numel() * self.stored.itemsize

    def narrow(self, dim: int, start: int, length: int) -> HeaderOnlyTensor:
        dim = self.check_narrow(dim, start, length)
        shape = list(self._shape)
        shape[dim] = length
        return HeaderOnlyTensor(self.name, self.file, self.stored, tuple(shape))

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        raise RuntimeError(f"{self.describe()}: only its header was read (a headers-only stream)")


class RowPermutedTensor(CheckpointTensor):
    """``base`` with its rows (dim 0) reordered: row ``i`` is ``base[perm[i]]``.

    Narrowing dim 0 narrows the permutation; a read fetches only the span of
    base rows the kept permutation touches, so a permutation local to blocks
    (rotary heads) still lets a TP rank read only its own heads.
    """

    def __init__(self, base: CheckpointTensor, perm: torch.Tensor) -> None:
        if perm.ndim != 1:
            raise ValueError("perm must be one-dimensional")
        self.base = base
        self.perm = perm
        self.name = base.name
        self.file = base.file

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.perm.numel()), *self.base.shape[1:])

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    @property
    def stored_type(self) -> str:
        return self.base.stored_type

    @property
    def nbytes(self) -> int:
        if self.perm.numel() == 0:
            return 0
        lo, hi = int(self.perm.min()), int(self.perm.max())
        rows = self.base.shape[0]
        return self.base.nbytes * (hi - lo + 1) // max(rows, 1)

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        dim = self.check_narrow(dim, start, length)
        if dim == 0:
            return RowPermutedTensor(self.base, self.perm.narrow(0, start, length))
        return RowPermutedTensor(self.base.narrow(dim, start, length), self.perm)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.perm.numel() == 0:
            import torch

            return torch.empty(self.shape, dtype=dtype or self.dtype)
        lo, hi = int(self.perm.min()), int(self.perm.max())
        span = self.base.narrow(0, lo, hi - lo + 1).read(dtype)
        return span.index_select(0, self.perm - lo).contiguous()


def interleaved_to_half_rotary(tensor: CheckpointTensor, n_heads: int) -> CheckpointTensor:
    """Reorder q/k projection rows from the interleaved rotary layout to the half-split one.

    Meta's original checkpoints, Mistral's native ``consolidated`` files and
    llama.cpp's GGUF store each head's rotary pairs interleaved
    (``x0, y0, x1, y1, ...``); Hugging Face (and our rotary embedding) expects
    the two halves split (``x0, x1, ..., y0, y1, ...``). Works on the leading
    dimension of a weight ``(n_heads * head_dim, in)`` or a bias.
    """
    import torch

    rows = tensor.shape[0]
    if n_heads <= 0 or rows % n_heads or (rows // n_heads) % 2:
        raise ShapeMismatchError(
            f"{tensor.describe()}: {rows} rows cannot be split into {n_heads} rotary heads"
        )
    head_dim = rows // n_heads
    half = head_dim // 2
    # target row h*hd + j*half + i comes from interleaved row h*hd + 2*i + j
    h = torch.arange(n_heads).view(n_heads, 1, 1)
    j = torch.arange(2).view(1, 2, 1)
    i = torch.arange(half).view(1, 1, half)
    perm = (h * head_dim + 2 * i + j).reshape(-1)
    return RowPermutedTensor(tensor, perm)
