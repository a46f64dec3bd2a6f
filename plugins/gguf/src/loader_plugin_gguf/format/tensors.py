"""``GGUFTensor``: one GGUF tensor as a lazily dequantized :class:`~loader.weights.CheckpointTensor`.

Nothing is read or dequantized until ``read``/``read_into``. ``narrow`` on rows (dim 0 of a
matrix) always narrows the bytes read, since ggml blocks never span rows. ``narrow`` on
columns does too when both ends fall on block boundaries (a TP split of a 32-value type, or
of a K-quant whose shard width is a multiple of 256); otherwise the enclosing whole blocks
are read and dequantized and the extra columns dropped, since a block cannot be decoded in
part. The bytes come from a copy-on-write memory map of the file shared by all its tensors.
"""

from __future__ import annotations

import mmap
import threading
from pathlib import Path

import torch

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.weights import CheckpointTensor, FileSpan, ReadStats

from .dequantize import FLOAT_TYPES, SUPPORTED_TYPES, block_shape, dequantize_into, is_supported, natural_dtype
from .header import TensorInfo

__all__ = ["GGUFTensor", "MappedFile"]


class MappedFile:
    """A GGUF file memory-mapped once, as a flat ``uint8`` tensor; pages load as tensors touch them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._bytes: torch.Tensor | None = None
        self._lock = threading.Lock()  # layers post-processed on two threads may map it at once

    def bytes(self) -> torch.Tensor:
        with self._lock:
            return self._map()

    def _map(self) -> torch.Tensor:
        if self._bytes is None:
            try:
                with self.path.open("rb") as fh:
                    # copy-on-write: writable for torch.frombuffer, never written back to the file
                    mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
            except (OSError, ValueError) as exc:
                raise CheckpointFormatError(f"{self.path}: cannot map the file: {exc}") from exc
            self._bytes = torch.frombuffer(mapped, dtype=torch.uint8)
        return self._bytes


class GGUFTensor(CheckpointTensor):
    """A (possibly narrowed) GGUF tensor: ``rows`` x ``cols`` window over its stored matrix.

    The stored tensor is viewed as a matrix ``[prod(shape[:-1]), shape[-1]]`` (ggml's rows);
    the logical shape is ``info.shape`` with dim 0 and the last dim narrowed.
    """

    def __init__(self, info: TensorInfo, file: MappedFile, stats: ReadStats, hf_name: str | None = None,
                 *, row_start: int = 0, rows: int | None = None, col_start: int = 0,
                 cols: int | None = None) -> None:
        self.info = info
        self.mapped = file
        self.stats = stats
        self.name = info.name
        self.hf_name = hf_name
        self.file = str(file.path)
        self._row_start = row_start
        self._rows = info.shape[0] if rows is None else rows
        self._col_start = col_start
        self._cols = info.shape[-1] if cols is None else cols

    @property
    def stored_type(self) -> str:
        """The GGUF block type (``Q4_1``, ``Q6_K``, ``F16``, ...)."""
        return str(self.info.type_name)

    def describe(self) -> str:
        mapped = f" ({self.hf_name})" if self.hf_name and self.hf_name != self.name else ""
        return f"tensor {self.name!r}{mapped} in {self.file}"

    @property
    def shape(self) -> tuple[int, ...]:
        full = self.info.shape
        if len(full) == 1:
            return (self._cols,)
        return (self._rows, *full[1:-1], self._cols)

    @property
    def dtype(self) -> torch.dtype:
        return natural_dtype(self.info.ggml_type)

    def _block_window(self) -> tuple[int, int]:
        """``(first_block, blocks)``: the whole blocks of each row that cover the column window."""
        block, _ = block_shape(self.info.ggml_type)
        first = self._col_start // block
        end = -(-(self._col_start + self._cols) // block)
        return first, end - first

    @property
    def nbytes(self) -> int:
        _, size = block_shape(self.info.ggml_type)
        inner = 1
        for d in self.info.shape[1:-1]:
            inner *= d
        rows = self._rows * inner if len(self.info.shape) > 1 else 1
        return rows * self._block_window()[1] * size

    def _with(self, **window: int) -> GGUFTensor:
        base = dict(row_start=self._row_start, rows=self._rows, col_start=self._col_start, cols=self._cols)
        base.update(window)
        return GGUFTensor(self.info, self.mapped, self.stats, self.hf_name, **base)

    def narrow(self, dim: int, start: int, length: int) -> GGUFTensor:
        dim = self.check_narrow(dim, start, length)
        last = len(self.info.shape) - 1
        if dim == last:
            return self._with(col_start=self._col_start + start, cols=length)
        if dim == 0:
            return self._with(row_start=self._row_start + start, rows=length)
        raise UnsupportedError(f"{self.describe()}: narrowing dim {dim} of a {len(self.info.shape)}-d "
                               "GGUF tensor is not supported")

    def file_span(self) -> FileSpan | None:
        """For float types (F32, F16, BF16) with whole rows: the window's bytes, which are the tensor as stored.

        GGUF's dims are innermost-first, so its rows are torch's row-major rows; blocks of quantized
        types and column windows are not one run of ``dtype`` values, and get ``None``.
        """
        full = self.info.shape
        if self.info.ggml_type not in FLOAT_TYPES or self._col_start != 0 or self._cols != full[-1]:
            return None
        if len(full) == 1 or self.info.nbytes == 0:
            return FileSpan(self.file, self.info.offset, self.info.nbytes, self.stats)
        per_row = self.info.nbytes // full[0]
        return FileSpan(self.file, self.info.offset + self._row_start * per_row, self._rows * per_row, self.stats)

    def _check_type(self) -> None:
        if not is_supported(self.info.ggml_type):
            raise UnsupportedError(
                f"{self.describe()}: ggml type {self.info.type_name} cannot be dequantized; "
                f"supported: {', '.join(SUPPORTED_TYPES)}"
            )

    def window_key(self) -> tuple[str, int, str, tuple[int, ...], int, int, int, int]:
        """What names this window's bytes: file, data offset, block type, stored shape, first row and rows,
        first column and columns (a packed-weights cache keys its units by it)."""
        return (self.file, self.info.offset, self.stored_type, tuple(self.info.shape), self._row_start, self._rows,
                self._col_start, self._cols)

    @property
    def columns(self) -> tuple[int, int]:
        """``(first column, columns)`` of this window within the stored rows."""
        return self._col_start, self._cols

    def enclosing_blocks(self) -> tuple[torch.Tensor, int]:
        """The whole blocks covering this window's columns and how many values of them precede the window.

        For a packed method that decodes blocks into smaller groups (a Q4_K
        super-block holds eight 32-value groups): a TP split on a group
        boundary inside a super-block keeps its part of the decoded groups.
        """
        block, _ = block_shape(self.info.ggml_type)
        return self._raw(), self._col_start - self._block_window()[0] * block

    def _raw(self) -> torch.Tensor:
        """The stored bytes of this window as ``uint8 [rows, row_bytes]`` (a view of the map)."""
        self._check_type()
        block, size = block_shape(self.info.ggml_type)
        full = self.info.shape
        stored_rows = 1
        for d in full[:-1]:
            stored_rows *= d
        row_bytes = full[-1] // block * size
        inner = stored_rows // full[0] if len(full) > 1 and full[0] else 1
        data = self.mapped.bytes()[self.info.offset:self.info.offset + self.info.nbytes]
        matrix = data.view(stored_rows, row_bytes)
        if len(full) > 1:
            matrix = matrix[self._row_start * inner:(self._row_start + self._rows) * inner]
        first, blocks = self._block_window()
        return matrix[:, first * size:(first + blocks) * size]

    def _decode_into(self, raw: torch.Tensor, out: torch.Tensor) -> None:
        """Dequantize ``raw`` (this window's whole blocks) into ``out`` (this window's shape)."""
        if out.numel() == 0:  # a zero dimension: nothing to decode (a kernel cannot reshape no blocks)
            return
        block, _ = block_shape(self.info.ggml_type)
        first, blocks = self._block_window()
        skip = self._col_start - first * block
        if skip == 0 and blocks * block == self._cols:
            dequantize_into(raw, self.info.ggml_type, out.view(-1, self._cols))
            return
        wide = torch.empty(raw.shape[0], blocks * block, dtype=out.dtype, device=out.device)
        dequantize_into(raw, self.info.ggml_type, wide)
        out.view(-1, self._cols).copy_(wide[:, skip:skip + self._cols])

    def read_into(self, out: torch.Tensor) -> None:
        """Dequantize into ``out``'s own storage, on ``out``'s device: only packed bytes travel."""
        self.check_destination(out)
        raw = self._raw()
        target = out if out.is_contiguous() else torch.empty(out.shape, dtype=out.dtype, device=out.device)
        packed = raw if target.device.type == "cpu" else raw.contiguous().to(target.device)
        self._decode_into(packed, target)
        if target is not out:
            out.copy_(target)
        self.stats.add(raw.numel(), tensors=1)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        raw = self._raw()
        out = torch.empty(self.shape, dtype=dtype or self.dtype)
        self._decode_into(raw, out)
        self.stats.add(raw.numel(), tensors=1)
        return out
