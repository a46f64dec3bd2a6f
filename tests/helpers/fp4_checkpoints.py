"""FP4 checkpoints of tiny ``transformers`` models, written from the formats' definitions, for the tests.

Kept independent of the plugin (its own rounding, nibble packing and scale
arithmetic) so the tests check the plugin rather than echo it. For one linear
weight ``W [N, K]``:

* E2M1 codes: 4 bits, bit 3 the sign, bits 0-2 the index of the magnitude in
  ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` (:data:`E2M1_MAGNITUDES`); each ``W / scale`` is
  rounded to the nearest magnitude (clamped at 6). Two codes per byte along the
  input dim: column ``2j`` in the low nibble, ``2j + 1`` in the high one.
* ``ct-nvfp4`` — compressed-tensors ``nvfp4-pack-quantized`` (llm-compressor's
  NVFP4A16): ``weight_global_scale`` float32 ``[1]`` = ``448 * 6 / max|W|``;
  per group of 16 inputs ``weight_scale`` float8_e4m3fn ``[N, K/16]`` =
  ``fp8(max|group| / 6 * global)``; the weight is ``code * (scale / global)``,
  computed in float32 and rounded to bfloat16 (the library decompresses to
  bfloat16 whatever the model's dtype).
* ``ct-mxfp4`` — ``mxfp4-pack-quantized`` (MXFP4A16): per group of 32,
  ``weight_scale`` uint8 ``[N, K/32]`` holds E8M0 exponents ``e`` of the scale
  ``2 ** (e - 127)``, ``e - 127 = floor(log2(max|group|)) - 2`` (OCP MX: the
  largest E2M1 exponent is 2); the weight is ``code * 2 ** (e - 127)``.
* ``modelopt-nvfp4`` — NVIDIA ModelOpt NVFP4: ``weight`` uint8 ``[N, K/2]``,
  ``weight_scale`` float8_e4m3fn ``[N, K/16]`` = ``fp8(max|group| / 6 / scale_2)``,
  ``weight_scale_2`` float32 ``[]`` = ``max|W| / (448 * 6)``, ``input_scale``
  float32 ``[]``; the weight is ``code * scale * scale_2`` in float32.
  ``quantization_config``: ``quant_method: "modelopt"``, ``quant_algo: "NVFP4"``.

The reference is the ``transformers`` model whose quantized linears hold these
weights. The decoding and the library's agree on hard-coded bytes
(``tests/plugins/marlin/test_fp4.py``), and llm-compressor's own files load
bit-equal (``test_llmcompressor.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.gptq_checkpoints import save_packed_checkpoint

LAYOUTS = ("ct-nvfp4", "ct-mxfp4", "modelopt-nvfp4")
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_MAX = 448.0
E2M1_MAX = 6.0
GROUP_SIZES = {"ct-nvfp4": 16, "ct-mxfp4": 32, "modelopt-nvfp4": 16}


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """The nearest E2M1 code of each value (already divided by its scale), as int64 0..15."""
    magnitude = values.abs().clamp(max=E2M1_MAX)
    index = (magnitude.unsqueeze(-1) - E2M1_MAGNITUDES).abs().argmin(dim=-1)
    return index + 8 * (values < 0).long()


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of codes 0..15 (the sign bit makes 8 a negative zero)."""
    sign = torch.where(codes >= 8, -1.0, 1.0)
    return sign * E2M1_MAGNITUDES[codes % 8]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` codes → uint8 ``[N, K/2]``, column ``2j`` in the low nibble."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)


def _grouped(weight: torch.Tensor, group: int) -> torch.Tensor:
    return weight.reshape(weight.shape[0], -1, group)


def _spread(per_group: torch.Tensor, group: int) -> torch.Tensor:
    return per_group.repeat_interleave(group, dim=1)


def quantize_nvfp4(weight: torch.Tensor, *, modelopt: bool) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The NVFP4 tensors of ``weight`` (compressed-tensors' names, or ModelOpt's) and the weight they hold."""
    amax = weight.abs().amax().clamp_min(1e-8)
    group_amax = _grouped(weight, 16).abs().amax(dim=-1)
    if modelopt:
        scale_2 = (amax / (FP8_MAX * E2M1_MAX)).reshape(())
        scales = (group_amax / E2M1_MAX / scale_2).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
        effective = scales.float() * scale_2
    else:
        global_scale = (FP8_MAX * E2M1_MAX / amax).reshape(1)
        scales = (group_amax / E2M1_MAX * global_scale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
        effective = scales.float() / global_scale
    spread = _spread(effective, 16)
    codes = e2m1_codes(torch.where(spread > 0, weight / spread.clamp_min(1e-30), torch.zeros_like(weight)))
    dequantized = e2m1_values(codes) * spread
    if modelopt:
        tensors = {"weight": pack_nibbles(codes), "weight_scale": scales, "weight_scale_2": scale_2,
                   "input_scale": torch.tensor(0.05)}
        return tensors, dequantized
    tensors = {"weight_packed": pack_nibbles(codes), "weight_scale": scales, "weight_global_scale": global_scale}
    return tensors, dequantized.to(torch.bfloat16).float()


def quantize_mxfp4(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The MXFP4 tensors of ``weight`` and the weight they hold."""
    group_amax = _grouped(weight, 32).abs().amax(dim=-1).clamp_min(2.0 ** -100)
    exponent = torch.floor(torch.log2(group_amax)) - 2
    spread = _spread(2.0 ** exponent, 32)
    codes = e2m1_codes(weight / spread)
    tensors = {"weight_packed": pack_nibbles(codes), "weight_scale": (exponent + 127).to(torch.uint8)}
    return tensors, e2m1_values(codes) * spread


def fp4_tensors(weight: torch.Tensor, layout: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One layer's tensors in ``layout`` and the weight they stand for."""
    if layout == "ct-mxfp4":
        return quantize_mxfp4(weight)
    return quantize_nvfp4(weight, modelopt=layout == "modelopt-nvfp4")


def ct_fp4_group(layout: str, group_size: int | None = None) -> dict[str, Any]:
    """One ``config_groups`` entry as llm-compressor 0.14 writes it for NVFP4A16 / MXFP4A16."""
    nv = layout == "ct-nvfp4"
    weights = {"actorder": None, "block_structure": None, "dynamic": False,
               "group_size": group_size or GROUP_SIZES[layout], "num_bits": 4, "observer": "memoryless_minmax",
               "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8",
               "strategy": "tensor_group" if nv else "group", "symmetric": True, "type": "float", "zp_dtype": None}
    fmt = "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized"
    return {"format": fmt, "input_activations": None, "output_activations": None, "targets": ["Linear"],
            "weights": weights}


def fp4_quantization_config(layout: str, group_size: int | None = None) -> dict[str, Any]:
    """The checkpoint's ``quantization_config``."""
    if layout == "modelopt-nvfp4":
        return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": group_size or 16,
                "ignore": ["lm_head"], "kv_cache_scheme": None, "producer": {"name": "modelopt", "version": "0.39"}}
    group = ct_fp4_group(layout, group_size)
    return {"quant_method": "compressed-tensors", "format": group["format"], "config_groups": {"group_0": group},
            "ignore": ["lm_head"], "kv_cache_scheme": None, "quantization_status": "compressed",
            "sparsity_config": {}, "transform_config": {}, "version": "0.19.0"}


def save_fp4_checkpoint(family: str, path: Path, layout: str, *, seed: int = 0,
                        **overrides: Any) -> tuple[Path, Any]:
    """Write a random ``family`` model with its decoder linears in FP4 ``layout``; return ``(path, reference)``."""

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return fp4_tensors(weight, layout)

    return save_packed_checkpoint(family, path, fp4_quantization_config(layout), pack, seed=seed, **overrides)
