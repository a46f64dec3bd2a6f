"""A pre-quantized 4-bit weight as one checkpoint tensor that narrows by whole blocks.

``transformers`` stores a bitsandbytes weight as six tensors (packed bytes,
``absmax``, ``quant_map``, optional nested ``absmax`` and code table, and the
JSON ``quant_state``). :class:`Packed4bitTensor` bundles them behind the
:class:`~loader.weights.CheckpointTensor` interface with the *logical* shape
``(out_features, in_features)``, so the layers' ordinary tensor-parallel
arithmetic (``shard_slice``) narrows it like a dense weight. A narrow is
accepted only when the kept elements are whole quantization blocks; then the
packed bytes and the ``absmax`` entries of the slice are exactly a sub-range
(or, for a column slice, a per-row sub-range) of the stored ones, and nothing
is re-quantized. Reading is still lazy: only the slice's bytes are fetched.

``read`` dequantizes (a layer that keeps the weight dense still loads);
``read_codes`` is what the bitsandbytes layers use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.errors import CheckpointFormatError, UnsupportedError
from loader.weights import CheckpointTensor

from .codec import NESTED_BLOCKSIZE, code_table, dequantize_absmax, dequantize_blocks
from .quant_state import QuantStateHeader

if TYPE_CHECKING:
    import torch

__all__ = ["BlockAlignmentError", "Packed4bitTensor", "QuantTensors"]


class BlockAlignmentError(UnsupportedError):
    """A slice of a packed weight does not start and end on quantization block boundaries."""


class QuantTensors:
    """The checkpoint tensors of one packed weight, checked against its header (nothing read)."""

    def __init__(self, packed: CheckpointTensor, absmax: CheckpointTensor, quant_map: CheckpointTensor,
                 header: QuantStateHeader, nested_absmax: CheckpointTensor | None = None,
                 nested_quant_map: CheckpointTensor | None = None) -> None:
        self.packed = packed
        self.absmax = absmax
        self.quant_map = quant_map
        self.header = header
        self.nested_absmax = nested_absmax
        self.nested_quant_map = nested_quant_map
        self._validate()

    def _expect(self, tensor: CheckpointTensor, numel: int, dtype: torch.dtype, role: str) -> None:
        if tensor.numel() != numel or tensor.dtype != dtype or tensor.ndim not in (1, 2) or (
            tensor.ndim == 2 and tensor.shape[1] != 1
        ):
            header = self.header
            raise CheckpointFormatError(
                f"{tensor.describe()}: {role} of a {header.quant_type} weight of shape {header.shape} with "
                f"blocksize {header.blocksize} must be {numel} {str(dtype).removeprefix('torch.')} values, "
                f"found {str(tensor.dtype).removeprefix('torch.')} of shape {tensor.shape}"
            )

    def _validate(self) -> None:
        import torch

        h = self.header
        self._expect(self.packed, h.packed_bytes, torch.uint8, "packed data")
        self._expect(self.absmax, h.blocks, torch.uint8 if h.nested else torch.float32, "absmax")
        self._expect(self.quant_map, 16, torch.float32, "quant_map")
        if h.nested:
            nested = ((self.nested_absmax, "nested_absmax"), (self.nested_quant_map, "nested_quant_map"))
            for tensor, role in nested:
                if tensor is None:
                    raise CheckpointFormatError(
                        f"{self.packed.describe()}: quant_state declares double quantization but the "
                        f"checkpoint has no {self.packed.name}.{role}"
                    )
            assert self.nested_absmax is not None and self.nested_quant_map is not None
            nested_blocks = -(-h.blocks // int(h.nested_blocksize or NESTED_BLOCKSIZE))
            self._expect(self.nested_absmax, nested_blocks, torch.float32, "nested_absmax")
            self._expect(self.nested_quant_map, 256, torch.float32, "nested_quant_map")

    def flat(self, tensor: CheckpointTensor) -> CheckpointTensor:
        """``tensor`` seen as one dimension (bitsandbytes saves ``(n, 1)`` as often as ``(n,)``)."""
        return tensor if tensor.ndim == 1 else _Flattened(tensor)

    def check_code_table(self) -> torch.Tensor:
        """The standard code table of the quant type, after checking the stored one agrees."""
        stored = self.quant_map.read().reshape(-1).float()
        table = code_table(self.header.quant_type)
        if not bool(((stored - table).abs() <= 1e-4).all()):
            raise CheckpointFormatError(
                f"{self.quant_map.describe()}: quant_map is not the {self.header.quant_type} code table"
            )
        return table


class _Flattened(CheckpointTensor):
    """An ``(n, 1)`` tensor narrowed and read as ``(n,)``."""

    def __init__(self, base: CheckpointTensor) -> None:
        self.base = base
        self.name = base.name
        self.file = base.file

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.base.shape[0],)

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def narrow(self, dim: int, start: int, length: int) -> CheckpointTensor:
        self.check_narrow(dim, start, length)
        return _Flattened(self.base.narrow(0, start, length))

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        return self.base.read(dtype).reshape(-1)


class Packed4bitTensor(CheckpointTensor):
    """A window ``rows x cols`` of a packed 4-bit weight, narrowed only along block boundaries."""

    def __init__(self, parts: QuantTensors, rows: tuple[int, int] | None = None,
                 cols: tuple[int, int] | None = None) -> None:
        self.parts = parts
        self.header = parts.header
        self.name = parts.packed.name
        self.file = parts.packed.file
        full_rows, full_cols = self.header.shape
        self.rows = rows if rows is not None else (0, full_rows)
        self.cols = cols if cols is not None else (0, full_cols)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.rows[1], self.cols[1])

    @property
    def dtype(self) -> torch.dtype:
        return self.header.torch_dtype

    @property
    def blocksize(self) -> int:
        return self.header.blocksize

    @property
    def full_columns(self) -> bool:
        return self.cols == (0, self.header.shape[1])

    @property
    def nbytes(self) -> int:
        n = self.rows[1] * self.cols[1]
        absmax_bytes = 1 if self.header.nested else 4
        return (n + 1) // 2 + -(-n // self.blocksize) * absmax_bytes

    def narrow(self, dim: int, start: int, length: int) -> Packed4bitTensor:
        dim = self.check_narrow(dim, start, length)
        rows, cols = self.rows, self.cols
        if dim == 0:
            rows = (rows[0] + start, length)
        else:
            cols = (cols[0] + start, length)
        self._check_blocks(rows, cols)
        return Packed4bitTensor(self.parts, rows, cols)

    def _check_blocks(self, rows: tuple[int, int], cols: tuple[int, int]) -> None:
        full_rows, full_cols = self.header.shape
        bs = self.blocksize
        if cols == (0, full_cols):
            first, count = rows[0] * full_cols, rows[1] * full_cols
            ends_tensor = rows[0] + rows[1] == full_rows
            if first % bs == 0 and (count % bs == 0 or ends_tensor):
                return
            what = f"rows [{rows[0]}, {rows[0] + rows[1]})"
        else:
            if full_cols % bs == 0 and cols[0] % bs == 0 and cols[1] % bs == 0:
                return
            what = f"columns [{cols[0]}, {cols[0] + cols[1]})"
        raise BlockAlignmentError(
            f"{self.describe()}: {what} of the packed weight of shape {self.header.shape} do not fall on "
            f"blocksize-{bs} boundaries, so they cannot be taken without re-quantizing"
        )

    def read_codes(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This window's packed bytes (1-D ``uint8``) and float32 ``absmax``, row-major.

        With double quantization ``absmax`` is dequantized here, exactly as
        bitsandbytes does before it dequantizes the weight.
        """
        self.parts.check_code_table()  # a stored table other than the standard one would be silently ignored
        full_cols = self.header.shape[1]
        bs = self.blocksize
        r0, nr = self.rows
        first, last = r0 * full_cols, (r0 + nr) * full_cols
        packed = self.parts.flat(self.parts.packed)
        data = packed.narrow(0, first // 2, (last + 1) // 2 - first // 2).read().reshape(-1)
        block_first, block_last = first // bs, -(-last // bs)
        absmax = self._read_absmax(block_first, block_last - block_first)
        if self.full_columns:
            return data, absmax
        c0, nc = self.cols
        data = data.view(nr, full_cols // 2)[:, c0 // 2:(c0 + nc) // 2].reshape(-1)
        absmax = absmax.view(nr, full_cols // bs)[:, c0 // bs:(c0 + nc) // bs].reshape(-1)
        return data, absmax

    def _read_absmax(self, start: int, count: int) -> torch.Tensor:
        import torch

        stored = self.parts.flat(self.parts.absmax).narrow(0, start, count).read().reshape(-1)
        header = self.header
        if not header.nested:
            return stored.to(torch.float32)
        assert self.parts.nested_absmax is not None and self.parts.nested_quant_map is not None
        scales = self.parts.nested_absmax.read().reshape(-1)
        code = self.parts.nested_quant_map.read().reshape(-1)
        return dequantize_absmax(stored, scales, code, float(header.nested_offset or 0.0),
                                 int(header.nested_blocksize or NESTED_BLOCKSIZE), start=start)

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dequantized values of this window (what a dense layer would hold)."""
        data, absmax = self.read_codes()
        values = dequantize_blocks(data, absmax, self.parts.check_code_table(), self.shape, self.blocksize,
                                   self.dtype)
        return values if dtype is None else values.to(dtype)
