"""Checkpoints written by llm-compressor itself, and the logits of ``transformers``' decompressed model of each.

Runs where llm-compressor is installed (tox env ``marlin-llmcompressor``, pinned by
``constraints-llmcompressor.txt``: llm-compressor 0.14 wants transformers 5.15-5.17 and compressed-tensors 0.19,
older than the main pins). A tiny random ``transformers`` model is written with a tokenizer, quantized by
``oneshot`` with a recipe (a preset scheme, or ``config_groups`` of our own) — data-free, or calibrated on a few
random sequences when the scheme has static activation or KV cache scales — and saved as llm-compressor saves it.

The reference is what a user of ``transformers`` gets: ``from_pretrained(..., dequantize=True)`` decompresses
the weights, and the forward still applies the scheme's activation quantization (compressed-tensors wraps each
quantized ``Linear``; measured: a W8A8 tiny Llama's logits move by 0.9% relative without it, FP8 dynamic by 3.7%).
Floating point parameters are cast to float32 first (the FP4 schemes decompress to bfloat16).

transformers 5.17 does not apply online rotations (``transform_config``: it reports the stored
``*_input.weight`` matrices as unexpected and drops them), so for those the reference is the model as
llm-compressor held it after ``oneshot``, before saving: its logits are saved beside the checkpoint
(:data:`IN_MEMORY_LOGITS`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from tests.helpers.hf_checkpoints import save_checkpoint, tiny_config
from tests.helpers.model_checks import random_ids
from tests.helpers.tokenizers_files import write_tokenizer

__all__ = ["IN_MEMORY_LOGITS", "SIZES", "decompressed_logits", "quantize_pretrained", "quantize_with_llmcompressor"]

IN_MEMORY_LOGITS = "in_memory_logits.pt"
"""Logits of ``random_ids(vocab_size)`` from the model ``oneshot`` quantized, before it was saved."""

SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256)
"""Wide enough for whole 128x128 FP8 blocks and 128-row groups."""


def _calibration(vocab_size: int) -> Any:
    from datasets import Dataset

    generator = torch.Generator().manual_seed(0)
    rows = torch.randint(3, vocab_size, (8, 32), generator=generator).tolist()
    return Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * 32 for _ in rows]})


def quantize_with_llmcompressor(family: str, path: Path, recipe: Any, *, save_compressed: bool = True,
                                calibrate: bool = False, seed: int = 0, **overrides: Any) -> Path:
    """Write a random ``family`` model to ``path/dense``, quantize it with ``recipe``, save to ``path/quantized``."""
    dense = path / "dense"
    config = tiny_config(family, **{**SIZES, **overrides})
    save_checkpoint(family, dense, config=config, seed=seed)
    write_tokenizer(dense, vocab_size=config.vocab_size)
    return quantize_pretrained(dense, path, recipe, save_compressed=save_compressed, calibrate=calibrate)


def quantize_pretrained(dense: Path, path: Path, recipe: Any, *, save_compressed: bool = True,
                        calibrate: bool = False) -> Path:
    """Quantize the float checkpoint (with its tokenizer) at ``dense`` with ``recipe`` into ``path/quantized``."""
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(dense, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(dense)
    vocab_size = model.config.vocab_size
    extra: dict[str, Any] = {}
    if calibrate:
        extra = {"dataset": _calibration(vocab_size), "num_calibration_samples": 8, "max_seq_length": 32}
    path.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(path):
        oneshot(model=model, recipe=recipe, tokenizer=tokenizer, **extra)
    out = path / "quantized"
    with torch.no_grad():  # the model as llm-compressor evaluated it, before saving
        in_memory = model(input_ids=random_ids(vocab_size), use_cache=False).logits
    model.save_pretrained(out, save_compressed=save_compressed)
    torch.save(in_memory, out / IN_MEMORY_LOGITS)
    tokenizer.save_pretrained(out)
    return out


def decompressed_logits(path: Path, input_ids: torch.Tensor) -> torch.Tensor:
    """``transformers``' logits for the checkpoint at ``path``, weights decompressed, in float32."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                 quantization_config=CompressedTensorsConfig(dequantize=True))
    for param in model.parameters():
        if param.is_floating_point() and param.dtype in (torch.bfloat16, torch.float16):
            param.data = param.data.float()
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=False).logits  # type: ignore[no-any-return]
