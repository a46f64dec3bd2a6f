"""The one internal representation every checkpoint format is converted into.

GPTQ, AWQ and compressed-tensors pack the same mathematics differently: an
integer code per weight, a scale and an integer zero point per (group of input
rows, output column), and a map from input row to group (``g_idx``, which
act-order shuffles). Converting each format to :class:`QuantizedWeight` first
means the kernels and the repacks (int4 CPU, Marlin) are written once, and
the tests compare every path against one dequantization,
:meth:`QuantizedWeight.dequantize`: ``w[n, k] = (codes[k, n] - zeros[g, n]) *
scales[g, n]`` with ``g = g_idx[k]``.
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["QuantizedWeight", "default_g_idx"]


def default_g_idx(rows: int, group_size: int, first_row: int = 0) -> torch.Tensor:
    """The group of each input row without act-order: ``k // group_size`` (0 for ``group_size`` -1)."""
    k = torch.arange(first_row, first_row + rows, dtype=torch.int32)
    return torch.zeros_like(k) if group_size == -1 else k // group_size


@attrs.frozen(eq=False)
class QuantizedWeight:
    """One linear layer's (one rank's) quantized weight, format-independent.

    :ivar codes: ``uint8 [K, N]``, unsigned codes in ``[0, 2**bits)``; input rows first, as GPTQ stores them.
    :ivar scales: ``float32 [G, N]``.
    :ivar zeros: ``int32 [G, N]``, the integer zero point of each group, so
        ``w = (code - zero) * scale``; symmetric checkpoints have ``2**(bits-1)``.
        GPTQ v1 checkpoints can yield ``2**bits`` (a zero of 0 stored minus one wraps).
    :ivar g_idx: ``int32 [K]``, the group (row of ``scales``) of each input row.
    :ivar bits: 4 or 8.
    :ivar group_size: input rows per group as declared (-1: one group); with
        act-order the rows of a group are not contiguous, and the last group may be partial.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor
    bits: int
    group_size: int

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[0])

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[1])

    @property
    def groups(self) -> int:
        return int(self.scales.shape[0])

    @property
    def act_order(self) -> bool:
        """Whether ``g_idx`` differs from the contiguous ``k // group_size``."""
        contiguous = default_g_idx(self.in_features, self.group_size).to(self.g_idx.device)
        return not torch.equal(self.g_idx.to(torch.int32), contiguous)

    def is_symmetric(self) -> bool:
        """Whether every zero point is the midpoint ``2**(bits-1)``."""
        return bool((self.zeros == 1 << (self.bits - 1)).all())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The weight ``[N, K]`` (``nn.Linear`` orientation), computed in float32, then cast to ``dtype``.

        ``(code - zero)`` is a small integer and scales come from 16-bit
        floats, so the float32 products are exact: this is the reference every
        kernel is compared against.
        """
        g = self.g_idx.long()
        w = (self.codes.to(torch.int32) - self.zeros[g]).to(torch.float32) * self.scales[g].to(torch.float32)
        return w.t().contiguous().to(dtype)
