"""compressed-tensors ``int-quantized`` (W8A8 / W8A16 int8) checkpoints and their references, for the tests.

Written from compressed-tensors 0.20's own definitions (``NaiveQuantizationCompressor`` / its alias
``IntQuantizationCompressor``, ``calculate_qparams``), independently of the plugin. Per ``W [N, K]``:

* symmetric: ``scale = amax / 127.5`` (``bit_range / 2``), ``q = clamp(round(w / scale), -128, 127)``;
* asymmetric: ``lo = min(w.min(), 0)``, ``hi = max(w.max(), 0)``, ``scale = (hi - lo) / 255``,
  ``zp = clamp(round(-128 - lo / scale), -128, 127)``, ``q = clamp(round(w / scale) + zp, -128, 127)``;
* over the whole tensor (``tensor``: ``weight_scale [1]``), each row (``channel``: ``[N, 1]``) or each
  ``group`` of input columns (``[N, K / group]``); ``weight`` int8 ``[N, K]``, ``weight_zero_point`` int8
  (asymmetric only), the weight is ``(q - zp) * scale``.
* static activations add ``input_scale`` float32 ``[1]`` (and ``input_zero_point`` int8 ``[1]`` when asymmetric).

The config is written as compressed-tensors' ``QuantizationConfig.to_dict()`` writes it (checked by printing
that for the ``W8A8`` preset). References: the ``transformers`` model holding the dequantized weights — what
``run_compressed=False`` (``dequantize=True``) loads, activations in full precision — and, with
:func:`fake_quantize_inputs`, the same model with each quantized linear's input quantized and dequantized as
compressed-tensors' wrapped forward does (the W8A8 math of the ``int8_mm`` kernel).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

import loader
from loader._plugins import create_plugin_host
from loader_plugin_marlin.int8_config import int8_scheme_from_ct
from tests.helpers.gptq_checkpoints import LINEARS, save_packed_checkpoint

METHOD = "int8-test"
"""The ``quantization=`` name :class:`Int8GroupPlugin` answers."""

STATIC_INPUT_SCALE = 0.03
"""The per-tensor ``input_scale`` written for static activations (one input feeds every fused part)."""
STATIC_INPUT_ZERO_POINT = 3


def quantize_int8(weight: torch.Tensor, strategy: str, *, symmetric: bool,
                  group_size: int = 32) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``weight``, ``weight_scale`` (and ``weight_zero_point``) of ``weight [N, K]``, and the weight they mean."""
    n, k = weight.shape
    w = weight.detach().to(torch.float32)
    if strategy == "tensor":
        blocks = w.reshape(1, 1, -1)
    elif strategy == "channel":
        blocks = w.reshape(n, 1, k)
    else:
        blocks = w.reshape(n, k // group_size, group_size)
    lo = blocks.amin(-1).clamp(max=0)
    hi = blocks.amax(-1).clamp(min=0)
    if symmetric:
        scale = torch.maximum(-lo, hi) / 127.5
        zero = torch.zeros_like(scale)
    else:
        scale = (hi - lo) / 255
        zero = torch.round(-128 - lo / scale).clamp(-128, 127)
    codes = (torch.round(blocks / scale[..., None]) + zero[..., None]).clamp(-128, 127)
    dequantized = ((codes - zero[..., None]) * scale[..., None]).reshape(n, k)
    shape = (1,) if strategy == "tensor" else tuple(scale.shape)
    tensors = {"weight": codes.reshape(n, k).to(torch.int8), "weight_scale": scale.reshape(shape).contiguous()}
    if not symmetric:
        tensors["weight_zero_point"] = zero.reshape(shape).to(torch.int8).contiguous()
    return tensors, dequantized


def int8_scheme(strategy: str = "channel", *, symmetric: bool = True, group_size: int = 32,
                activations: str | None = "token", activation_symmetric: bool = True) -> dict[str, Any]:
    """One ``config_groups`` entry as compressed-tensors 0.20 serializes it (``activations``: ``token`` dynamic,
    ``tensor`` static, ``None`` weight-only)."""
    weights = {"num_bits": 8, "type": "int", "symmetric": symmetric,
               "group_size": group_size if strategy == "group" else None, "strategy": strategy, "dynamic": False}
    acts = None if activations is None else {
        "num_bits": 8, "type": "int", "symmetric": activation_symmetric, "group_size": None,
        "strategy": activations, "dynamic": activations == "token"}
    return {"targets": ["Linear"], "weights": weights, "input_activations": acts, "output_activations": None,
            "format": None}


def int8_quantization_config(scheme: dict[str, Any]) -> dict[str, Any]:
    """The whole ``quantization_config`` around one group, with the head kept dense."""
    return {"config_groups": {"group_0": scheme}, "quant_method": "compressed-tensors", "kv_cache_scheme": None,
            "format": "int-quantized", "quantization_status": "compressed", "global_compression_ratio": None,
            "ignore": ["lm_head"], "moe_sparsity_config": None}


def save_int8_checkpoint(family: str, path: Path, scheme: dict[str, Any], *, seed: int = 0,
                         **overrides: Any) -> tuple[Path, Any]:
    """A random ``family`` model with every decoder linear int8-quantized by ``scheme``; its dequantized reference."""
    weights = scheme["weights"]
    acts = scheme["input_activations"]

    def pack(weight: torch.Tensor, module: str) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        tensors, dequantized = quantize_int8(weight, weights["strategy"], symmetric=weights["symmetric"],
                                             group_size=weights["group_size"] or 32)
        if acts is not None and not acts["dynamic"]:
            tensors["input_scale"] = torch.tensor([STATIC_INPUT_SCALE])
            if not acts["symmetric"]:
                tensors["input_zero_point"] = torch.tensor([STATIC_INPUT_ZERO_POINT], dtype=torch.int8)
        return tensors, dequantized

    return save_packed_checkpoint(family, path, int8_quantization_config(scheme), pack, seed=seed, **overrides)


def fake_quantize(x: torch.Tensor, activations: dict[str, Any]) -> torch.Tensor:
    """``x`` quantized to int8 and back as compressed-tensors' forward does for ``input_activations``."""
    if not activations["dynamic"]:
        scale = torch.tensor(STATIC_INPUT_SCALE)
        zero = torch.tensor(0.0 if activations["symmetric"] else float(STATIC_INPUT_ZERO_POINT))
    elif activations["symmetric"]:
        scale = x.abs().amax(-1, keepdim=True) / 127.5
        zero = torch.zeros_like(scale)
    else:
        lo, hi = x.amin(-1, keepdim=True).clamp(max=0), x.amax(-1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / 255
        zero = torch.round(-128 - lo / scale).clamp(-128, 127)
    codes = torch.round(x / scale + zero).clamp(-128, 127)
    return (codes - zero) * scale


def fake_quantize_inputs(model: Any, activations: dict[str, Any]) -> Any:
    """``model`` with every quantized linear's input fake-quantized (forward pre-hooks); returns it."""
    for name, module in model.named_modules():
        if name.rpartition(".")[2] in LINEARS:
            module.register_forward_pre_hook(lambda _module, args: (fake_quantize(args[0], activations),))
    return model


class Int8GroupPlugin:
    """Answers ``quantization="int8-test"`` with ``int8_scheme_from_ct`` of the checkpoint's ``group_0``: every
    linear layer is an int8 layer of that group (the compressed-tensors dispatcher is tested on its own)."""

    @loader.hookimpl
    def loader_detect_quantization(self, hf_config: Any, requested: str | None, options: Any) -> Any:
        if requested != METHOD:
            return None
        scheme = hf_config["quantization_config"]["config_groups"]["group_0"]
        return int8_scheme_from_ct("group_0", scheme, options.quantization_options)


def int8_host() -> Any:
    """A plugin host with :class:`Int8GroupPlugin` registered."""
    host = create_plugin_host()
    host.register(Int8GroupPlugin(), METHOD)
    return host
