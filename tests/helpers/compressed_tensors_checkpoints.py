"""The compressed-tensors ``pack-quantized`` reference: a packer from the format's definition, for the tests.

Quantization is :func:`tests.helpers.gptq_checkpoints.quantize` (codes in
``[0, 2**bits)``; compressed-tensors' signed value is ``code - 2**(bits-1)``
and it stores ``signed + 2**(bits-1)``, i.e. the same code). Per ``W [N, K]``:

* ``weight_packed`` int32 ``[N, K/p]``: packed along the input dim, low bits first;
* ``weight_scale`` ``[N, G]`` (written in ``scale_dtype``);
* ``weight_zero_point`` int32 ``[N/p, G]`` (asymmetric only): packed along the output dim;
* ``weight_shape`` int64 ``[N, K]``; ``weight_g_idx`` int32 ``[K]`` with ``actorder: "group"``.

llm-compressor 0.14 writes this layout (``DESIGN.md``: ``weight_packed`` I32
``[out, in/8]``, ``weight_scale`` F32 ``[out, groups]``, ``weight_shape``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.gptq_checkpoints import (
    Quantized,
    dequantize,
    input_seed,
    pack_words,
    quantize,
    save_packed_checkpoint,
)


def pack_compressed_tensors(weight: torch.Tensor, bits: int, group_size: int, *, sym: bool, actorder: bool,
                            seed: int = 0,
                            scale_dtype: torch.dtype = torch.float32) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The ``weight_*`` tensors of ``weight [N, K]`` and the weight they stand for."""
    q = quantize(weight, bits, group_size, sym=sym, act_order=actorder, seed=seed)
    return ct_tensors(q, sym=sym, actorder=actorder, scale_dtype=scale_dtype), dequantize(q)


def ct_tensors(q: Quantized, *, sym: bool, actorder: bool = False,
               scale_dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The ``weight_*`` tensors of one quantized weight (the packing step alone, for any scales and zeros)."""
    tensors = {
        "weight_packed": pack_words(q.codes.t(), q.bits),
        "weight_scale": q.scales.t().to(scale_dtype).contiguous(),
        "weight_shape": torch.tensor([q.codes.shape[1], q.codes.shape[0]], dtype=torch.int64),
    }
    if not sym:
        tensors["weight_zero_point"] = pack_words(q.zeros, q.bits).t().contiguous()
    if actorder:
        tensors["weight_g_idx"] = q.g_idx.clone()
    return tensors


def ct_group(bits: int, group_size: int, *, sym: bool, actorder: bool = False, targets: tuple[str, ...] = ("Linear",),
             fmt: str | None = None) -> dict[str, Any]:
    """One ``config_groups`` entry as compressed-tensors writes it (``fmt``: a per-group ``format``)."""
    weights = {"num_bits": bits, "type": "int", "symmetric": sym, "strategy": "channel" if group_size == -1 else
               "group", "group_size": None if group_size == -1 else group_size,
               "actorder": "group" if actorder else None, "dynamic": False, "observer": "minmax"}
    group: dict[str, Any] = {"targets": list(targets), "weights": weights, "input_activations": None,
                             "output_activations": None}
    if fmt is not None:
        group["format"] = fmt
    return group


def ct_quantization_config(bits: int, group_size: int, *, sym: bool, actorder: bool,
                           ignore: list[str] | None = None) -> dict[str, Any]:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": ct_group(bits, group_size, sym=sym, actorder=actorder)},
            "ignore": ["lm_head", *(ignore or [])]}


def save_ct_checkpoint(family: str, path: Path, *, bits: int = 4, group_size: int = 32, sym: bool = True,
                       actorder: bool = False, ignore: tuple[str, ...] = (), seed: int = 0,
                       **overrides: Any) -> tuple[Path, Any]:
    """A random ``family`` model, pack-quantized except the ``ignore`` modules, and its dequantized reference."""
    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return pack_compressed_tensors(weight, bits, group_size, sym=sym, actorder=actorder, seed=input_seed(module))

    return save_packed_checkpoint(family, path, ct_quantization_config(bits, group_size, sym=sym, actorder=actorder,
                                                                       ignore=list(ignore)),
                                  pack, keep_dense=ignore, seed=seed, **overrides)
