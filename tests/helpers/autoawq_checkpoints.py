"""AWQ (GEMM) checkpoints packed by AutoAWQ's own code on the CPU, and AutoAWQ's own dequantization of them.

AutoAWQ 0.2.9 installs here with the CPU torch (its optional CUDA extension
``awq_ext`` is simply absent). Its end-to-end ``AutoAWQForCausalLM.quantize``
is not used: its activation-aware scale search needs calibration text through
the model and is irrelevant to the file layout. What is used is the part that
writes the bytes, exactly as ``AwqQuantizer._apply_quant`` runs it: each
decoder linear cast to float16, ``AwqQuantizer.pseudo_quantize_tensor``
(round to nearest with zero point; called on a stand-in holding its three
settings, so no model or tokenizer is needed), then
``WQLinear_GEMM.from_linear`` (AWQ's interleaved packing). The model's
state dict is saved with ``huggingface_hub.save_torch_state_dict`` and
``AwqConfig.to_transformers_dict()`` as ``quantization_config``, as
``save_quantized`` does.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import torch

from tests.helpers.gptq_checkpoints import LINEARS
from tests.helpers.hf_checkpoints import build_model, tiny_config


def awq_quantize(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AutoAWQ's ``pseudo_quantize_tensor`` of a float16 ``weight [N, K]``: (fake-quantized weight, scales
    ``[G, N]``, zeros ``[G, N]``), transposed as ``_apply_quant`` hands them to ``from_linear``."""
    from awq.quantize.quantizer import AwqQuantizer

    settings = types.SimpleNamespace(group_size=group_size, zero_point=True, w_bit=4)
    fake, scales, zeros = AwqQuantizer.pseudo_quantize_tensor(settings, weight.to(torch.float16))
    return fake, scales.t().contiguous(), zeros.t().contiguous()


def awq_linear(linear: torch.nn.Linear, group_size: int) -> Any:
    """``linear`` quantized and packed by AutoAWQ: a ``WQLinear_GEMM``."""
    from awq.modules.linear.gemm import WQLinear_GEMM

    linear = linear.half()
    fake, scales, zeros = awq_quantize(linear.weight.data, group_size)
    linear.weight.data = fake
    return WQLinear_GEMM.from_linear(linear, 4, group_size, init_only=False, scales=scales, zeros=zeros)


def save_autoawq_checkpoint(family: str, path: Path, *, group_size: int = 64, seed: int = 0,
                            **overrides: Any) -> Path:
    """A random ``family`` model (float16, as AutoAWQ loads one) with its decoder linears packed by AutoAWQ."""
    from awq.models._config import AwqConfig
    from huggingface_hub import save_torch_state_dict

    model = build_model(family, tiny_config(family, **overrides), seed=seed).half()
    for module in list(model.modules()):
        for leaf, child in list(module.named_children()):
            if leaf in LINEARS and isinstance(child, torch.nn.Linear):
                setattr(module, leaf, awq_linear(child, group_size))
    config = AwqConfig(zero_point=True, q_group_size=group_size, w_bit=4, version="gemm")
    model.config.quantization_config = config.to_transformers_dict()
    path.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(path)
    state = model.state_dict()
    if model.config.tie_word_embeddings:  # left to hf_hub's dedup, the tied pair keeps only ``lm_head.weight``
        del state["lm_head.weight"]
    save_torch_state_dict(state_dict=state, save_directory=str(path))
    return path


def autoawq_dequantized_weights(path: Path) -> dict[str, torch.Tensor]:
    """Each packed module's weight by AutoAWQ's ``dequantize_gemm`` (``[in, out]``), as ``[out, in]`` float32."""
    from awq.utils.packing_utils import dequantize_gemm
    from safetensors.torch import load_file

    group_size = json.loads((path / "config.json").read_text())["quantization_config"]["group_size"]
    tensors = load_file(path / "model.safetensors")
    weights = {}
    for name in tensors:
        if name.endswith(".qweight"):
            module = name.removesuffix(".qweight")
            weight = dequantize_gemm(tensors[name], tensors[f"{module}.qzeros"], tensors[f"{module}.scales"], 4,
                                     group_size)
            weights[module] = weight.to(torch.float32).t().contiguous()
    return weights


def reference_from_autoawq(family: str, path: Path, weights: dict[str, torch.Tensor], **overrides: Any) -> Any:
    """A float32 ``transformers`` model: the checkpoint's float tensors plus AutoAWQ's dequantized linears."""
    from safetensors.torch import load_file

    model = build_model(family, tiny_config(family, **overrides))
    state = {name: tensor.to(torch.float32) for name, tensor in load_file(path / "model.safetensors").items()
             if name.rpartition(".")[2] not in ("qweight", "qzeros", "scales")}
    state.update({f"{name}.weight": weight for name, weight in weights.items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(name == "lm_head.weight" for name in missing), (missing, unexpected)
    return model.eval()
