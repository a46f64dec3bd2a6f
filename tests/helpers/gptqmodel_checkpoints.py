"""Checkpoints written by GPTQModel itself (on the CPU), and GPTQModel's own dequantization of them.

GPTQModel 7.6 quantizes on this CPU with its torch backend; on a 2-core
machine ``GPTQMODEL_CPU_WORKERS=2`` is needed (its default pool of 1 refuses
a sub-pool of 2). A tiny random model with a word-level tokenizer and a few
random calibration sentences is enough: the point is the file layout GPTQModel
writes (v1 ``qzeros``, ``g_idx`` with act-order, a partial last group), not
the quality of the quantization.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from tests.helpers.gguf_dense import save_dense_from_gguf
from tests.helpers.hf_checkpoints import save_checkpoint, tiny_config
from tests.helpers.moe_packed_checkpoints import transformers_model_of
from tests.helpers.tokenizers_files import write_tokenizer


def calibration(vocab_size: int, count: int = 16, length: int = 48, seed: int = 0) -> list[dict[str, list[int]]]:
    """Random token ids, already tokenized (GPTQModel's text path dropped every sample for Qwen2 here)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab_size, (count, length), generator=generator)
    return [{"input_ids": row.tolist(), "attention_mask": [1] * length} for row in ids]


def save_gptqmodel_checkpoint(family: str, path: Path, *, bits: int = 4, group_size: int = 128, sym: bool = True,
                              desc_act: bool = False, seed: int = 0, lm_head: bool = False, **overrides: Any) -> Path:
    """Write a random dense ``family`` model to ``path/dense`` and GPTQModel's quantization of it to ``path/gptq``
    (``lm_head``: quantize the output head too, GPTQModel's ``QuantizeConfig(lm_head=True)``)."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel, QuantizeConfig

    dense = path / "dense"
    config = tiny_config(family, **overrides)
    save_checkpoint(family, dense, config=config, seed=seed)
    write_tokenizer(dense, vocab_size=config.vocab_size)
    # name a pad token, or GPTQModel's tokenizer wrapper adds one past the vocabulary for Qwen2
    tokenizer_config = json.loads((dense / "tokenizer_config.json").read_text())
    (dense / "tokenizer_config.json").write_text(json.dumps({**tokenizer_config, "pad_token": "<unk>"}))
    quant = QuantizeConfig(bits=bits, group_size=group_size, sym=sym, desc_act=desc_act, lm_head=lm_head)
    out = path / "gptq"
    with contextlib.chdir(path):  # GPTQModel writes a logs/ folder into the working directory
        model = GPTQModel.load(str(dense), quant, device="cpu")
        model.quantize(calibration(config.vocab_size), batch_size=4)
        model.save(str(out))
    return out


def gptqmodel_dequantized_weights(path: Path,
                                  dtype: torch.dtype = torch.float16) -> tuple[Any, dict[str, torch.Tensor]]:
    """GPTQModel's reload of ``path`` and each quantized linear's ``dequantize_weight()`` as ``[out, in]`` float32."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel
    from gptqmodel.nn_modules.qlinear import BaseQuantLinear
    from gptqmodel.utils.backend import BACKEND

    model = GPTQModel.load(str(path), device="cpu", backend=BACKEND.GPTQ_TORCH, dtype=dtype)
    weights = {}
    for name, module in model.model.named_modules():
        if isinstance(module, BaseQuantLinear):
            # dequantize_weight() is [in, out] (scales[g_idx] * (codes - zeros[g_idx])), square or not
            weights[name] = module.dequantize_weight().to(torch.float32).t().contiguous()
    return model, weights


def reference_from_gptqmodel(path: Path, dense: Path, weights: dict[str, torch.Tensor]) -> Any:
    """A float32 ``transformers`` model with the checkpoint's float tensors and GPTQModel's dequantized linears."""
    import transformers
    from safetensors.torch import load_file

    model = transformers.AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)
    state = {name: tensor.to(torch.float32) for name, tensor in load_file(path / "model.safetensors").items()
             if name.rpartition(".")[2] not in ("qweight", "qzeros", "scales", "g_idx")}
    state.update({f"{name}.weight": weight for name, weight in weights.items()})
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(name == "lm_head.weight" for name in missing), (missing, unexpected)
    return model.eval()


def reference_from_gptqmodel_experts(path: Path, weights: dict[str, torch.Tensor]) -> Any:
    """:func:`reference_from_gptqmodel` for a mixture-of-experts checkpoint: its float tensors and GPTQModel's
    dequantized linears (attention and every expert part, by their per-expert names) loaded by
    ``transformers.from_pretrained``, which fuses the experts its own way."""
    from safetensors.torch import load_file

    state = {name: tensor for name, tensor in load_file(path / "model.safetensors").items()
             if name.rpartition(".")[2] not in ("qweight", "qzeros", "scales", "g_idx")}
    state.update({f"{name}.weight": weight for name, weight in weights.items()})
    config = json.loads((path / "config.json").read_text())
    return transformers_model_of(path.parent / "dequantized", config, state)


CALIBRATION_TEXT = (
    "The river runs through the old town, past the market square and the stone bridge built three centuries ago.",
    "To make bread, mix flour, water, salt and yeast, knead the dough for ten minutes and let it rise until doubled.",
    "Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar, releasing oxygen as they do.",
    "Paris is the capital of France, Berlin is the capital of Germany, and Madrid is the capital of Spain.",
    "A function that calls itself is recursive; every recursion needs a base case or it never stops.",
    "The committee met on Tuesday to review the budget and agreed to postpone the decision until next month.",
    "Water boils at one hundred degrees Celsius at sea level, but at a lower temperature high in the mountains.",
    "She opened the window, listened to the rain on the roof, and decided that the letter could wait until morning.",
)


def save_gptqmodel_from_gguf(gguf_file: Path, path: Path, *, group_size: int = 128, desc_act: bool = True) -> Path:
    """A real model for GPTQModel: ``gguf_file`` dequantized by transformers' GGUF loader into a float checkpoint
    at ``path/dense`` (with its tokenizer), then 4-bit quantized by GPTQModel on the CPU, calibrated on a few real
    sentences in the model's chat template, into ``path/gptq``."""
    os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    from gptqmodel import GPTQModel, QuantizeConfig

    dense = path / "dense"
    tokenizer = save_dense_from_gguf(gguf_file, dense)
    samples = []
    for text in CALIBRATION_TEXT:
        chat = tokenizer.apply_chat_template([{"role": "user", "content": "Say something."},
                                              {"role": "assistant", "content": text}], tokenize=False)
        ids = tokenizer.encode(chat, add_special_tokens=False)
        samples.append({"input_ids": ids, "attention_mask": [1] * len(ids)})
    quant = QuantizeConfig(bits=4, group_size=group_size, sym=True, desc_act=desc_act)
    out = path / "gptq"
    with contextlib.chdir(path):
        quantizing = GPTQModel.load(str(dense), quant, device="cpu")
        quantizing.quantize(samples, batch_size=4)
        quantizing.save(str(out))
    return out
