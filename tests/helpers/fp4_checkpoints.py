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
* ``ct-nvfp4-w4a4`` — llm-compressor's ``NVFP4`` preset: ``ct-nvfp4`` weights plus
  ``input_activations`` (FP4, groups of 16, ``dynamic: "local"``) and each
  linear's ``input_global_scale`` float32 ``[1]`` = ``448 * 6 / max|x|`` over a
  calibration batch; the reference rounds every linear's input to NVFP4
  (:func:`round_input`) as compressed-tensors' forward does.
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

from tests.helpers.gptq_checkpoints import LINEARS, save_packed_checkpoint
from tests.helpers.hf_checkpoints import build_model, tiny_config
from tests.helpers.model_checks import random_ids

LAYOUTS = ("ct-nvfp4", "ct-mxfp4", "modelopt-nvfp4", "ct-nvfp4-w4a4")
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_MAX = 448.0
E2M1_MAX = 6.0
GROUP_SIZES = {"ct-nvfp4": 16, "ct-mxfp4": 32, "modelopt-nvfp4": 16, "ct-nvfp4-w4a4": 16}


def e2m1_codes(values: torch.Tensor) -> torch.Tensor:
    """The nearest E2M1 code of each value (already divided by its scale), as int64 0..15; a value halfway
    between two magnitudes takes the one with an even mantissa (even index), as compressed-tensors rounds."""
    magnitude = values.abs().clamp(max=E2M1_MAX)
    distance = (magnitude.unsqueeze(-1) - E2M1_MAGNITUDES).abs()
    nearest = distance == distance.amin(dim=-1, keepdim=True)
    even = nearest & (torch.arange(8) % 2 == 0)
    index = torch.where(even.any(dim=-1), even.int().argmax(dim=-1), nearest.int().argmax(dim=-1))
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
    """One ``config_groups`` entry as llm-compressor 0.14 writes it for NVFP4A16 / MXFP4A16 / NVFP4."""
    nv = layout.startswith("ct-nvfp4")
    weights = {"actorder": None, "block_structure": None, "dynamic": False,
               "group_size": group_size or GROUP_SIZES[layout], "num_bits": 4, "observer": "memoryless_minmax",
               "observer_kwargs": {}, "scale_dtype": "torch.float8_e4m3fn" if nv else "torch.uint8",
               "strategy": "tensor_group" if nv else "group", "symmetric": True, "type": "float", "zp_dtype": None}
    fmt = "nvfp4-pack-quantized" if nv else "mxfp4-pack-quantized"
    acts = None
    if layout == "ct-nvfp4-w4a4":
        acts = {**weights, "dynamic": "local", "observer": "static_minmax"}
    return {"format": fmt, "input_activations": acts, "output_activations": None, "targets": ["Linear"],
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


def round_input(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """compressed-tensors' NVFP4 input rounding: per token and group of 16 columns, ``s = fp8(g * max|x| / 6)``
    (a zero becomes 0.125), ``x' = e2m1(x * g / s) * s / g``."""
    groups = x.reshape(*x.shape[:-1], -1, 16)
    scale = (global_scale * groups.abs().amax(dim=-1, keepdim=True) / E2M1_MAX).clamp(max=FP8_MAX)
    scale = scale.to(torch.float8_e4m3fn).float()
    step = torch.where(scale == 0, torch.tensor(0.125), scale) / global_scale
    return (e2m1_values(e2m1_codes(groups / step)) * step).reshape(x.shape)


def calibrated_input_global_scales(family: str, seed: int, **overrides: Any) -> dict[str, torch.Tensor]:
    """``448 * 6 / max|x|`` of each decoder linear's input over a batch of random ids (the dense model's), as
    llm-compressor's static min-max observer calibrates ``input_global_scale``."""
    model = build_model(family, tiny_config(family, **overrides), seed=seed)
    found: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in LINEARS:
            def record(module: Any, args: tuple[torch.Tensor, ...], name: str = name) -> None:
                found[name] = (FP8_MAX * E2M1_MAX / args[0].abs().amax()).reshape(1)
            handles.append(module.register_forward_pre_hook(record))
    with torch.no_grad():
        model(random_ids(model.config.vocab_size, seed=3), use_cache=False)
    for handle in handles:
        handle.remove()
    return found


def save_fp4_checkpoint(family: str, path: Path, layout: str, *, seed: int = 0,
                        **overrides: Any) -> tuple[Path, Any]:
    """Write a random ``family`` model with its decoder linears in FP4 ``layout``; return ``(path, reference)``.

    ``ct-nvfp4-w4a4`` (llm-compressor's NVFP4 preset) also stores each linear's ``input_global_scale`` and the
    reference rounds each linear's input with it (:func:`round_input`, a forward pre-hook).
    """
    inputs = calibrated_input_global_scales(family, seed, **overrides) if layout == "ct-nvfp4-w4a4" else {}

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        tensors, dequantized = fp4_tensors(weight, "ct-nvfp4" if inputs else layout)
        if module in inputs:
            tensors["input_global_scale"] = inputs[module]
        return tensors, dequantized

    path, reference = save_packed_checkpoint(family, path, fp4_quantization_config(layout), pack, seed=seed,
                                             **overrides)
    for name, module in reference.named_modules():
        if name in inputs:
            def rounding(module: Any, args: tuple[torch.Tensor, ...], scale: torch.Tensor = inputs[name]) -> Any:
                return (round_input(args[0], scale), *args[1:])
            module.register_forward_pre_hook(rounding)
    return path, reference
