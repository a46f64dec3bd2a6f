"""bitsandbytes 4-bit checkpoints written by ``transformers``, and the references to check them against.

``transformers`` quantizes a dense checkpoint while loading it with
``BitsAndBytesConfig(load_in_4bit=True, ...)`` and ``save_pretrained`` writes
the packed layout (``weight`` + ``absmax``/``quant_map``/nested tensors/JSON
``quant_state``). On the CPU the first forward of a bitsandbytes layer repacks
its weight in place, so the checkpoint is saved before any forward, and the
reference model is reloaded from disk.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.helpers.hf_checkpoints import save_checkpoint, tiny_config


def save_bnb_checkpoint(
    family: str, path: Path, *, quant_type: str = "nf4", double_quant: bool = True,
    compute_dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any,
) -> Path:
    """Write a random dense ``family`` checkpoint to ``path/dense`` and its 4-bit form to ``path/bnb``."""
    import transformers

    dense = path / "dense"
    save_checkpoint(family, dense, config=tiny_config(family, **overrides), seed=seed)
    quant = transformers.BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type=quant_type, bnb_4bit_use_double_quant=double_quant,
        bnb_4bit_compute_dtype=compute_dtype,
    )
    model = transformers.AutoModelForCausalLM.from_pretrained(
        dense, quantization_config=quant, dtype=torch.float32, device_map="cpu"
    )
    out = path / "bnb"
    model.save_pretrained(out)
    return out


def load_transformers_bnb(path: Path) -> Any:
    """``transformers``' own reload of a bitsandbytes checkpoint (the reference)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cpu")
    return model.eval()


def dequantized_linear_weights(model: Any) -> dict[str, torch.Tensor]:
    """Every 4-bit linear weight of a ``transformers`` model, dequantized (call before any forward)."""
    import bitsandbytes.functional as F
    from bitsandbytes.nn import Linear4bit

    weights = {}
    for name, module in model.named_modules():
        if isinstance(module, Linear4bit):
            weights[f"{name}.weight"] = F.dequantize_4bit(module.weight.data, module.weight.quant_state)
    return weights


def packed_weight_tensors(
    name: str, weight: torch.Tensor, *, quant_type: str = "nf4", double_quant: bool = True, blocksize: int = 64
) -> dict[str, torch.Tensor]:
    """The tensors ``transformers`` saves for one 4-bit weight called ``name`` (``...proj.weight``)."""
    import bitsandbytes.functional as F

    packed, state = F.quantize_4bit(weight, blocksize=blocksize, quant_type=quant_type,
                                    compress_statistics=double_quant)
    tensors = {name: packed}
    for key, value in state.as_dict(packed=True).items():
        tensors[f"{name}.{key}"] = value
    return tensors
