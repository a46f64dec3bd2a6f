"""FP8 checkpoints of tiny ``transformers`` models, written from each producer's definition, for the tests.

Every decoder linear ``W [N, K]`` is rounded to ``float8_e4m3fn`` with scales
``max|W| / 448`` over the layout's unit (a tensor, a row, a block), written
beside the float tensors the checkpoint keeps, with the producer's
``quantization_config``:

* ``fp8-block`` — transformers' FineGrainedFP8 / DeepSeek-V3: ``weight_scale_inv``
  ``[ceil(N/bn), ceil(K/bk)]`` (a partial last block when the block does not divide);
* ``fp8-tensor`` — the same with ``weight_block_size: null``: a scalar ``weight_scale_inv``;
* ``fbgemm`` — ``weight_scale [N, 1]``, ``activation_scale_ub``;
* ``ct-tensor-static``, ``ct-tensor-dynamic``, ``ct-channel-token``, ``ct-block-group`` —
  compressed-tensors 0.20 ``float-quantized`` (presets ``FP8``, ``FP8_DYNAMIC``,
  ``FP8_BLOCK``; the config dict as ``QuantizationConfig.model_dump`` writes it):
  ``weight_scale`` ``[1]``, ``[N, 1]`` or the block grid, and a static ``input_scale [1]``
  calibrated as ``max|x| / 448`` over a batch of random ids.

The reference is the ``transformers`` model whose linears hold the dequantized
weights and, where the producer's CPU reference rounds the inputs to FP8
(compressed-tensors' decompressed forward; fbgemm's per-row quantization), a
forward pre-hook doing that rounding — written here from the formats'
definitions, independently of the loader's code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tests.helpers.gptq_checkpoints import LINEARS, save_packed_checkpoint
from tests.helpers.hf_checkpoints import build_model, tiny_config
from tests.helpers.model_checks import random_ids

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
LAYOUTS = ("fp8-block", "fp8-tensor", "fbgemm", "ct-tensor-static", "ct-tensor-dynamic", "ct-channel-token",
           "ct-block-group")
SCALE_UB = 1200.0


def fp8_round(values: torch.Tensor) -> torch.Tensor:
    return values.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _spread(scale: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    """A block grid of scales expanded to every element of a weight of ``shape``."""
    rows = scale.repeat_interleave(block[0], 0)[: shape[0]]
    return rows.repeat_interleave(block[1], 1)[:, : shape[1]]


def quantize_blocks(weight: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 [N, K], scales [ceil(N/bn), ceil(K/bk)])`` — zero-padded to whole blocks for the maxima."""
    n, k = weight.shape
    rows, cols = math.ceil(n / block[0]), math.ceil(k / block[1])
    padded = torch.zeros(rows * block[0], cols * block[1])
    padded[:n, :k] = weight
    amax = padded.reshape(rows, block[0], cols, block[1]).abs().amax(dim=(1, 3))
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    return fp8_round(weight / _spread(scale, block, weight.shape)), scale


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    return q.to(torch.float32) * _spread(scale, block, q.shape)


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8, scales [N, 1])``."""
    scale = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return fp8_round(weight / scale), scale


def quantize_tensor(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8, scale [1])``."""
    scale = (weight.abs().amax() / FP8_MAX).clamp(min=1e-12).reshape(1)
    return fp8_round(weight / scale), scale


def fake_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``x`` on the FP8 grid of ``scale``, computed in ``x``'s dtype (as compressed-tensors does)."""
    scale = scale.to(x.dtype)
    return fp8_round(x / scale).to(x.dtype) * scale


def _dynamic_scale(amax: torch.Tensor, bound: float | None = None) -> torch.Tensor:
    if bound is not None:
        amax = amax.clamp(max=bound)
    scale = amax / FP8_MAX
    return torch.where(scale == 0, torch.finfo(scale.dtype).eps, scale)


def input_rounding(layout: str, group: int = 0, static: torch.Tensor | None = None) -> Callable[..., Any] | None:
    """The forward pre-hook that rounds a linear's input as the producer's CPU reference does (``None``: none)."""
    if layout in ("fp8-block", "fp8-tensor"):
        return None
    if layout == "ct-tensor-static":
        assert static is not None
        return lambda module, args: (fake_quantize(args[0], static),)
    if layout == "ct-tensor-dynamic":
        return lambda module, args: (fake_quantize(args[0], _dynamic_scale(args[0].abs().amax())),)
    if layout == "ct-block-group":
        def by_group(module: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor]:
            groups = args[0].unflatten(-1, (-1, group))
            return (fake_quantize(groups, _dynamic_scale(groups.abs().amax(-1, keepdim=True))).flatten(-2),)
        return by_group
    bound = SCALE_UB if layout == "fbgemm" else None
    return lambda module, args: (fake_quantize(args[0], _dynamic_scale(args[0].abs().amax(-1, keepdim=True),
                                                                        bound)),)


def ct_fp8_group(layout: str, block: tuple[int, int]) -> dict[str, Any]:
    """One ``config_groups`` entry as compressed-tensors 0.20 writes presets FP8 / FP8_DYNAMIC / FP8_BLOCK."""
    strategy = layout.split("-")[1]
    weights: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None,
                               "strategy": strategy, "dynamic": False}
    if strategy == "block":
        weights = {**weights, "block_structure": list(block)}
        weights["dynamic"] = weights.pop("dynamic")
    acts: dict[str, Any] = {"num_bits": 8, "type": "float", "symmetric": True, "group_size": None}
    acts.update({"ct-tensor-static": {"strategy": "tensor", "dynamic": False, "observer": "static_minmax"},
                 "ct-tensor-dynamic": {"strategy": "tensor", "dynamic": True},
                 "ct-channel-token": {"strategy": "token", "dynamic": True},
                 "ct-block-group": {"group_size": block[1], "strategy": "group", "dynamic": True}}[layout])
    return {"targets": ["Linear"], "weights": weights, "input_activations": acts, "output_activations": None,
            "format": None}


def fp8_quantization_config(layout: str, block: tuple[int, int] = (32, 32),
                            skip: tuple[str, ...] = ("lm_head",)) -> dict[str, Any]:
    """The ``quantization_config`` each producer writes for ``layout``."""
    if layout.startswith("fp8"):
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": list(block) if layout == "fp8-block" else None,
                "modules_to_not_convert": list(skip)}
    if layout == "fbgemm":
        return {"quant_method": "fbgemm_fp8", "activation_scale_ub": SCALE_UB, "modules_to_not_convert": list(skip)}
    return {"config_groups": {"group_0": ct_fp8_group(layout, block)}, "quant_method": "compressed-tensors",
            "kv_cache_scheme": None, "format": "float-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": list(skip), "moe_sparsity_config": None}


def fp8_tensors(weight: torch.Tensor, layout: str, block: tuple[int, int]) -> tuple[dict[str, torch.Tensor],
                                                                                     torch.Tensor]:
    """The layer's tensors for ``layout`` (no ``input_scale``) and the weight they stand for."""
    if layout == "fp8-block" or layout == "ct-block-group":
        q, scale = quantize_blocks(weight, block)
        name = "weight_scale_inv" if layout == "fp8-block" else "weight_scale"
        return {"weight": q, name: scale}, dequantize_blocks(q, scale, block)
    if layout in ("fbgemm", "ct-channel-token"):
        q, scale = quantize_rows(weight)
        return {"weight": q, "weight_scale": scale}, q.to(torch.float32) * scale
    q, scale = quantize_tensor(weight)
    name = "weight_scale_inv" if layout == "fp8-tensor" else "weight_scale"
    return {"weight": q, name: scale.reshape(()) if layout == "fp8-tensor" else scale}, q.to(torch.float32) * scale


def calibrated_input_scales(family: str, seed: int, **overrides: Any) -> dict[str, torch.Tensor]:
    """``max|x| / 448`` of each decoder linear's input over a batch of random ids (the dense model's)."""
    model = build_model(family, tiny_config(family, **overrides), seed=seed)
    found: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in LINEARS:
            def record(module: Any, args: tuple[torch.Tensor, ...], name: str = name) -> None:
                found[name] = (args[0].abs().amax() / FP8_MAX).reshape(1)
            handles.append(module.register_forward_pre_hook(record))
    with torch.no_grad():
        model(random_ids(model.config.vocab_size, seed=3), use_cache=False)
    for handle in handles:
        handle.remove()
    return found


def save_fp8_checkpoint(family: str, path: Path, layout: str, *, block: tuple[int, int] = (32, 32), seed: int = 0,
                        **overrides: Any) -> tuple[Path, Any]:
    """Write a random ``family`` model with its decoder linears in FP8 ``layout``; return ``(path, reference)``."""
    statics = calibrated_input_scales(family, seed, **overrides) if layout == "ct-tensor-static" else {}

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        tensors, dequantized = fp8_tensors(weight, layout, block)
        if module in statics:
            tensors["input_scale"] = statics[module]
        return tensors, dequantized

    path, reference = save_packed_checkpoint(family, path, fp8_quantization_config(layout, block), pack, seed=seed,
                                             **overrides)
    for name, module in reference.named_modules():
        hook = input_rounding(layout, block[1], statics.get(name)) if name.rpartition(".")[2] in LINEARS else None
        if hook is not None:
            module.register_forward_pre_hook(hook)
    return path, reference
