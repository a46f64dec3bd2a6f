"""Checkpoints written by the ``compressed-tensors`` library itself (the code llm-compressor saves through).

llm-compressor calibrates (its observers pick each group's min/max), then
``ModelCompressor.compress_model`` packs every quantized module, the model's
``save_pretrained`` writes the tensors and ``ModelCompressor.update_config``
writes ``quantization_config`` into ``config.json``. Here the calibration step
is the library's own ``calculate_qparams`` over each group's min/max (what the
default ``minmax`` observer feeds it); the rest is the library's code path.

compressed-tensors 0.20.1 no longer has act-order with a ``g_idx``
(``actorder: "group"`` was removed; no code under ``compressed_tensors/``
reads ``weight_g_idx``), so these checkpoints have contiguous groups only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.hf_checkpoints import build_model, tiny_config


def quantization_args(bits: int, group_size: int, *, sym: bool) -> Any:
    """The library's weight arguments: ``group_size == -1`` is its ``channel`` strategy."""
    from compressed_tensors.quantization import QuantizationArgs

    if group_size == -1:
        return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy="channel")
    return QuantizationArgs(num_bits=bits, type="int", symmetric=sym, strategy="group", group_size=group_size)


def calibrate(model: Any, args: Any) -> None:
    """Set every quantized module's ``weight_scale``/``weight_zero_point`` from its groups' min/max."""
    from compressed_tensors.quantization.utils import calculate_qparams

    for module in model.modules():
        if not hasattr(module, "weight_scale"):
            continue
        weight = module.weight.detach()
        size = weight.shape[1] if args.group_size is None else args.group_size
        groups = weight.reshape(weight.shape[0], -1, size)
        scale, zero = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
        module.weight_scale.data.copy_(scale.reshape(module.weight_scale.shape))
        if hasattr(module, "weight_zero_point"):
            module.weight_zero_point.data.copy_(zero.reshape(module.weight_zero_point.shape))


def save_ct_library_checkpoint(family: str, path: Path, *, bits: int = 4, group_size: int = 32, sym: bool = True,
                               seed: int = 0, **overrides: Any) -> Path:
    """A random ``family`` model quantized and saved by compressed-tensors (``lm_head`` ignored) at ``path``."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme, apply_quantization_config

    model = build_model(family, tiny_config(family, **overrides), seed=seed)
    args = quantization_args(bits, group_size, sym=sym)
    config = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                                ignore=["lm_head"])
    apply_quantization_config(model, config, show_progress=False)
    calibrate(model, args)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="pack-quantized")
    compressor.compress_model(model)
    model.save_pretrained(path)
    compressor.update_config(str(path))
    return path


def ct_library_dequantized_weights(path: Path) -> dict[str, torch.Tensor]:
    """Each packed module's weight as the library decompresses it (``PackedQuantizationCompressor.decompress``
    with the scheme read back from ``config.json``), ``{module name: [out, in] float32}``."""
    import json

    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationConfig
    from safetensors.torch import load_file

    config = QuantizationConfig.model_validate(json.loads((path / "config.json").read_text())["quantization_config"])
    (scheme,) = config.config_groups.values()
    tensors = load_file(path / "model.safetensors")
    weights = {}
    for name in tensors:
        if name.endswith(".weight_packed"):
            module = name.removesuffix(".weight_packed")
            state = {key.rpartition(".")[2]: value for key, value in tensors.items()
                     if key.rpartition(".")[0] == module}
            weights[module] = PackedQuantizationCompressor.decompress(state, scheme)["weight"].to(torch.float32)
    return weights


def reference_from_ct_library(family: str, path: Path, weights: dict[str, torch.Tensor], **overrides: Any) -> Any:
    """A float32 ``transformers`` model: the checkpoint's float tensors plus the library's decompressed linears."""
    from safetensors.torch import load_file

    model = build_model(family, tiny_config(family, **overrides))
    state = {name: tensor.to(torch.float32) for name, tensor in load_file(path / "model.safetensors").items()
             if not name.rpartition(".")[2].startswith("weight_")}
    state.update({f"{name}.weight": weight for name, weight in weights.items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(name == "lm_head.weight" for name in missing), (missing, unexpected)
    return model.eval()
