"""A tiny pre-quantized bitsandbytes (NF4) Llama checkpoint, for the reliability corpus.

Every linear weight of :data:`~tests.helpers.malformed.TINY_LLAMA` is stored as
``transformers`` stores a 4-bit weight (packed ``uint8`` plus ``absmax``,
``quant_map``, nested tensors and the JSON ``quant_state``), quantized with
bitsandbytes directly, so no ``transformers`` model is built. Embeddings, norms
and ``lm_head`` stay dense, as ``transformers`` leaves them.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tests.helpers.bnb_checkpoints import packed_weight_tensors
from tests.helpers.malformed import TINY_LLAMA, llama_tensors, write_config, write_safetensors

__all__ = [
    "BNB_QUANTIZATION_CONFIG",
    "QUANT_STATE_SUFFIX",
    "quant_state_bytes",
    "read_quant_state",
    "write_bnb_checkpoint",
]

BNB_QUANTIZATION_CONFIG = {
    "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
    "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": True, "bnb_4bit_compute_dtype": "float32",
    "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": None,
}
QUANT_STATE_SUFFIX = ".quant_state.bitsandbytes__nf4"
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quant_state_bytes(text: str) -> torch.Tensor:
    """A ``quant_state`` tensor holding ``text`` (as ``transformers`` stores the JSON)."""
    return torch.tensor(list(text.encode()), dtype=torch.uint8)


def write_bnb_checkpoint(folder: Path, *, seed: int = 0) -> dict[str, torch.Tensor]:
    """``config.json`` (with ``quantization_config``) and one ``model.safetensors``; returns its tensors."""
    write_config(folder, {**TINY_LLAMA, "quantization_config": BNB_QUANTIZATION_CONFIG})
    tensors: dict[str, torch.Tensor] = {}
    for name, value in llama_tensors(seed=seed).items():
        if any(f".{linear}." in name for linear in _LINEARS):
            tensors.update(packed_weight_tensors(name, value, quant_type="nf4", double_quant=True))
        else:
            tensors[name] = value
    write_safetensors(folder / "model.safetensors", tensors)
    return tensors


def read_quant_state(tensors: dict[str, torch.Tensor], weight: str) -> dict[str, object]:
    """The decoded ``quant_state`` JSON of ``weight``."""
    return json.loads(bytes(tensors[weight + QUANT_STATE_SUFFIX].tolist()))  # type: ignore[no-any-return]
