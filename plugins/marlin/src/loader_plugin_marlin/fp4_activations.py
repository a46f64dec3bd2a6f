"""FP4 activations as compressed-tensors' reference computes them (the ``NVFP4`` preset: W4A4).

llm-compressor's ``NVFP4`` scheme quantizes each linear's input too: per token,
per group of 16 input columns, with a static per-layer ``input_global_scale``
``g`` calibrated on data and a dynamic group scale (``dynamic: "local"``).
compressed-tensors' forward (what ``transformers`` runs for a decompressed
checkpoint) rounds the input to that grid before the matmul; reproducing it is
what brings the logits to its reference (weight-only decoding is ~15 % off on a
tiny Llama). Per group:

* ``s = fp8(g * max|x| / 6)`` (clamped to 448; a zero scale becomes 0.125, fp8's epsilon there);
* ``x' = e2m1(x / (s / g)) * (s / g)``, ``e2m1`` rounding to the nearest of
  ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` (clamped at 6) with compressed-tensors' tie rule:
  0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4, 5 → 4.

The groups lie along the input dim, so a row-parallel rank (holding whole
groups) rounds its own columns exactly as one process would.
"""

from __future__ import annotations

import torch

__all__ = ["E2M1_TIES", "round_to_e2m1", "round_input_to_nvfp4"]

FP8_MAX = 448.0
E2M1_MAX = 6.0
ZERO_SCALE = 0.125
"""compressed-tensors' replacement for a zero FP8 group scale (its eps for float8_e4m3fn)."""
E2M1_TIES = ((0.25, 0.0, True), (0.75, 0.5, False), (1.25, 1.0, True), (1.75, 1.5, False), (2.5, 2.0, True),
             (3.5, 3.0, False), (5.0, 4.0, True))
"""``(boundary, value below, boundary rounds down)``: each magnitude up to a boundary rounds to the value below
it (at the boundary itself when the third field says so), above the last one to 6."""


def round_to_e2m1(values: torch.Tensor) -> torch.Tensor:
    """Each value rounded to the nearest E2M1 value (sign kept), ties as compressed-tensors breaks them."""
    magnitude = values.abs().clamp(max=E2M1_MAX)
    rounded = torch.full_like(magnitude, E2M1_MAX)
    for boundary, below, inclusive in reversed(E2M1_TIES):
        at_or_below = magnitude <= boundary if inclusive else magnitude < boundary
        rounded = torch.where(at_or_below, below, rounded)
    return torch.where(values < 0, -rounded, rounded)


def round_input_to_nvfp4(x: torch.Tensor, global_scale: torch.Tensor, group_size: int = 16) -> torch.Tensor:
    """``x`` (``[..., K]``) rounded to NVFP4 per group of ``group_size`` columns with the layer's static
    ``global_scale`` (a float32 scalar), returned in ``x``'s dtype; computed in float32."""
    global_scale = global_scale.to(torch.float32)
    grouped = x.to(torch.float32).unflatten(-1, (x.shape[-1] // group_size, group_size))
    amax = grouped.abs().amax(dim=-1, keepdim=True)
    scales = (global_scale * (amax / E2M1_MAX)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).to(torch.float32)
    scales = torch.where(scales == 0, ZERO_SCALE, scales)
    step = scales / global_scale
    rounded = round_to_e2m1((grouped / step).clamp(-E2M1_MAX, E2M1_MAX)) * step
    return rounded.flatten(-2).to(x.dtype)
