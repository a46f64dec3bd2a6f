"""What an FP4 checkpoint stores per linear layer, and the weight it stands for.

Two 4-bit float layouts, both E2M1 codes (1 sign, 2 exponent, 1 mantissa
bit: magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4, 6``) packed two per byte along the
input dim, the even column in the low nibble, with one scale per group of
input columns:

* NVFP4 — groups of 16, ``float8_e4m3fn`` group scales and one float32 global
  scale per tensor. compressed-tensors (``nvfp4-pack-quantized``) stores the
  global scale as a divisor (``weight_global_scale``, ``W = code * (scale /
  global)``); NVIDIA ModelOpt stores its inverse as a factor (``weight_scale_2``,
  ``W = code * scale * scale_2``).
* MXFP4 (compressed-tensors ``mxfp4-pack-quantized``) — groups of 32, ``uint8``
  E8M0 group scales (``2 ** (e - 127)``), no global scale.

The weight is computed in float32 in the producer's order (compressed-tensors:
the scale divided by the global scale first, then multiplied by the code).
compressed-tensors defines its decompressed weight in bfloat16 whatever the
model's dtype (what ``transformers`` computes with), so a compressed-tensors
layer is rounded to bfloat16 first: its decoded weight equals the library's bit
for bit (float32 would differ from that reference by up to 2**-9 relative per
weight on NVFP4, about 3e-3 on a tiny model's logits). MXFP4 weights are exact
in bfloat16; ModelOpt's are kept in float32 precision (no such reference).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["E2M1_VALUES", "FP4_SCHEMES", "MXFP4", "MODELOPT_NVFP4", "NVFP4", "NVFP4_W4A4", "Fp4Scheme", "decode_e2m1",
           "decode_e8m0", "dequantize_fp4"]

E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
"""The value of each 4-bit code: bit 3 the sign, bits 0-2 the magnitude's index."""
E8M0_BIAS = 127


@attrs.frozen
class Fp4Scheme:
    """One producer's FP4 layout: group size, the tensors' names and what they hold.

    :ivar kind: ``nvfp4`` or ``mxfp4``.
    :ivar packed_name: the packed codes (``weight_packed``, ModelOpt: ``weight``).
    :ivar global_name: the per-tensor scale (``None`` for MXFP4).
    :ivar global_divides: the weight is divided by the global scale (compressed-tensors) or multiplied
        (ModelOpt's ``weight_scale_2``).
    :ivar decompressed_dtype: the dtype the producer's own decompression rounds the weight to (``None``: none).
    :ivar input_name: a per-tensor activation scale the checkpoint stores beside the weight: compressed-tensors'
        ``input_global_scale`` (applied: :mod:`.fp4_activations`) or ModelOpt's ``input_scale`` (read and
        checked, not applied: see :mod:`.fp4_config`).
    :ivar input_applied: the inputs are rounded to NVFP4 with the ``input_name`` scale before the matmul.
    """

    kind: str
    group_size: int
    scale_dtype: torch.dtype
    packed_name: str = "weight_packed"
    global_name: str | None = None
    global_divides: bool = True
    input_name: str | None = None
    decompressed_dtype: torch.dtype | None = None
    input_applied: bool = False

    @property
    def scale_type(self) -> str:
        return "E8M0 (uint8)" if self.kind == "mxfp4" else "float8_e4m3fn"


NVFP4 = Fp4Scheme("nvfp4", 16, torch.float8_e4m3fn, global_name="weight_global_scale",
                  decompressed_dtype=torch.bfloat16)
NVFP4_W4A4 = attrs.evolve(NVFP4, input_name="input_global_scale", input_applied=True)
"""llm-compressor's ``NVFP4`` preset: NVFP4 weights and activations."""
MXFP4 = Fp4Scheme("mxfp4", 32, torch.uint8, decompressed_dtype=torch.bfloat16)
MODELOPT_NVFP4 = Fp4Scheme("nvfp4", 16, torch.float8_e4m3fn, packed_name="weight", global_name="weight_scale_2",
                           global_divides=False, input_name="input_scale")
FP4_SCHEMES = {"nvfp4-pack-quantized": NVFP4, "mxfp4-pack-quantized": MXFP4}
"""compressed-tensors' format name → its layout."""


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """``uint8 [N, K/2]`` → float32 ``[N, K]``: the low nibble is column ``2j``, the high nibble ``2j + 1``.

    One lookup per byte in a 256 x 2 table (an embedding gather): twice as fast as splitting the nibbles and
    looking each up.
    """
    values = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    byte_pairs = torch.stack((values.repeat(16), values.repeat_interleave(16)), dim=1)
    return F.embedding(packed.long(), byte_pairs).reshape(packed.shape[0], -1)


def decode_e8m0(exponents: torch.Tensor) -> torch.Tensor:
    """MX scales: biased exponents ``e`` (uint8) → float32 ``2 ** (e - 127)`` (exact; 255 is infinity)."""
    return torch.exp2(exponents.to(torch.float32) - E8M0_BIAS)


def _group_scales(scheme: Fp4Scheme, tensors: Mapping[str, torch.Tensor], part_rows: torch.Tensor) -> torch.Tensor:
    """float32 ``[N, K/group]``: each group's scale with its part's global scale folded in, in the producer's
    order (``part_rows``: the rows of each fused part, to spread a per-part global scale)."""
    if scheme.kind == "mxfp4":
        return decode_e8m0(tensors["weight_scale"])
    scales = tensors["weight_scale"].to(torch.float32)
    assert scheme.global_name is not None
    per_row = tensors[scheme.global_name].to(torch.float32).repeat_interleave(part_rows).unsqueeze(1)
    return scales / per_row if scheme.global_divides else scales * per_row


def dequantize_fp4(scheme: Fp4Scheme, tensors: Mapping[str, torch.Tensor], part_rows: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor:
    """This rank's weight ``[N, K]`` in ``dtype`` from its packed codes and scales, rounded once to ``dtype``
    (twice when the producer defines its weight in another dtype: :attr:`Fp4Scheme.decompressed_dtype`).

    :param part_rows: int64 ``[parts]``, each fused part's rows on this rank (its global scale covers them).
    """
    values = decode_e2m1(tensors[scheme.packed_name])
    scales = _group_scales(scheme, tensors, part_rows)
    values = values.view(values.shape[0], -1, scheme.group_size).mul_(scales.unsqueeze(2))
    values = values.reshape(values.shape[0], -1)
    if scheme.decompressed_dtype is not None:
        values = values.to(scheme.decompressed_dtype)
    return values.to(dtype)
