"""The ``int8`` head (Q8_0 / Q6_K codes per block, one int8 matmul per block) as a kernel path weight.

So the head is planned like the linear layers (:func:`loader.kernels.plan_weight_paths`): the per-block int8
calls (``packed``), or the codes dequantized per call and one matmul (``dequantize``), whichever this machine
measured faster for the tokens in the call — a prompt's logits go through the whole vocabulary, where one
dequantization can beat 18 int8 calls.
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["Int8HeadWeight"]


@attrs.frozen(eq=False)
class Int8HeadWeight:
    """Int8 ``codes`` ``[blocks, rows, block]`` and their ``scales`` ``[blocks, rows]`` in the kernel's dtype.

    :meth:`matmul` returns float32 (the blocks' partial products summed in float32)."""

    codes: torch.Tensor
    scales: torch.Tensor

    @property
    def kernel_dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def in_features(self) -> int:
        return int(self.codes.shape[0] * self.codes.shape[2])

    @property
    def out_features(self) -> int:
        return int(self.codes.shape[1])

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``sum_b (x_b @ codes_b.T) * scale_b``: one int8 matmul per block, ``x`` in the kernel's dtype."""
        blocks, block = self.codes.shape[0], self.codes.shape[2]
        flat = x.reshape(-1, blocks * block).to(self.kernel_dtype)
        # one copy gives every block's activations as a contiguous [m, block] matrix (not one copy per block)
        parts = flat.reshape(flat.shape[0], blocks, block).transpose(0, 1).contiguous()
        out = torch.ops.aten._weight_int8pack_mm(parts[0], self.codes[0], self.scales[0]).to(torch.float32)
        for b in range(1, blocks):
            out += torch.ops.aten._weight_int8pack_mm(parts[b], self.codes[b], self.scales[b])
        return out.reshape(*x.shape[:-1], self.out_features)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        values = self.codes.to(torch.float32) * self.scales.to(torch.float32).unsqueeze(-1)  # [blocks, rows, block]
        return values.permute(1, 0, 2).reshape(self.out_features, self.in_features).to(dtype)

    def rows(self, start: int, stop: int) -> Int8HeadWeight:
        return Int8HeadWeight(self.codes[:, start:stop].contiguous(), self.scales[:, start:stop].contiguous())
