"""The AWQ (GEMM) format reference: a packer written from the format's definition, for the marlin plugin's tests.

Quantization is :func:`tests.helpers.gptq_checkpoints.quantize` (asymmetric,
contiguous groups: AWQ has no act-order). Per linear weight ``W [N, K]``:

* ``qweight`` int32 ``[K, N/8]``: word ``c`` of row ``k`` holds, in bits
  ``[4i, 4i+4)``, the code of column ``8c + AWQ_ORDER[i]``,
  ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`` (AutoAWQ's ``pack``);
* ``qzeros`` int32 ``[G, N/8]``: the zero points, same interleave, stored as they are;
* ``scales`` float16 ``[G, N]``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.gptq_checkpoints import Quantized, dequantize, pack_words, quantize, save_packed_checkpoint

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def _interleaved(values: torch.Tensor) -> torch.Tensor:
    """``values [R, N]`` with each run of eight columns in AWQ's order (so plain packing gives AWQ's words)."""
    rows, n = values.shape
    return values.reshape(rows, n // 8, 8)[:, :, list(AWQ_ORDER)].reshape(rows, n)


def pack_awq(weight: torch.Tensor, group_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """AWQ's three tensors for ``weight [N, K]`` and the weight they stand for."""
    q = quantize(weight, 4, group_size, sym=False)
    return awq_tensors(q), dequantize(q)


def awq_tensors(q: Quantized) -> dict[str, torch.Tensor]:
    """AWQ's three tensors of one 4-bit quantized weight (the packing step alone, for any scales and zeros)."""
    return {
        "qweight": pack_words(_interleaved(q.codes), 4),
        "qzeros": pack_words(_interleaved(q.zeros), 4),
        "scales": q.scales.to(torch.float16).clone(),
    }


def awq_quantization_config(group_size: int) -> dict[str, Any]:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm",
            "modules_to_not_convert": None}


def save_awq_checkpoint(family: str, path: Path, *, group_size: int = 64, seed: int = 0,
                        **overrides: Any) -> tuple[Path, Any]:
    """A random ``family`` model with AWQ-packed decoder linears at ``path``, and its dequantized reference."""
    return save_packed_checkpoint(family, path, awq_quantization_config(group_size),
                                  lambda weight, module: pack_awq(weight, group_size), seed=seed, **overrides)
