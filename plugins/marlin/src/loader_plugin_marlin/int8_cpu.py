"""torch's int8 weight CPU matmul (``_weight_int8pack_mm``) for channelwise 8-bit weights.

The kernel multiplies by int8 codes ``[N, K]`` with one scale per output
channel. An affine channelwise weight ``w = code * scale + bias`` (``bias =
-zero * scale``) is rewritten as ``(code - 128) * scale + (128 * scale +
bias)``; the constant per-channel term is added as ``sum(x) * offset``, so
asymmetric weights run too. Grouped 8-bit weights (several scales along K)
do not fit it.
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["Int8CpuWeight", "pack_int8"]


@attrs.frozen(eq=False)
class Int8CpuWeight:
    """A channelwise 8-bit weight for ``_weight_int8pack_mm``.

    :ivar codes: int8 ``[N, K]``, ``code - 128``.
    :ivar scales: ``[N]``.
    :ivar offsets: ``[N]`` added per unit of input sum, or ``None`` when symmetric.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    offsets: torch.Tensor | None

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` for ``x [..., K]`` in x's dtype."""
        flat = x.reshape(-1, self.codes.shape[1]).contiguous()
        scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.codes, scales)
        if self.offsets is not None:
            out = out + flat.sum(-1, keepdim=True) * self.offsets.to(x.dtype)
        return out.reshape(*x.shape[:-1], out.shape[-1])


def pack_int8(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, dtype: torch.dtype) -> Int8CpuWeight:
    """Channelwise ``w[n, k] = (codes[n, k] - zeros[n]) * scales[n]`` (codes in ``[0, 256)``) for the kernel."""
    s = scales.to(torch.float32)
    offsets = (128 - zeros.to(torch.float32)) * s
    symmetric = bool((zeros == 128).all())
    return Int8CpuWeight(
        codes=(codes.to(torch.int16) - 128).to(torch.int8).contiguous(), scales=s.to(dtype),
        offsets=None if symmetric else offsets.to(dtype),
    )
