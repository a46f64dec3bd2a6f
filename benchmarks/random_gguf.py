"""A random Llama written as GGUF by the tests' own writer (gguf-py), once, under ``benchmarks/out/``.

Shared by the benchmarks that need a file of a given block-type mix rather than SmolLM2's real weights
(``bench_gguf_k_m_memory.py``, ``bench_gguf_q8_0.py``). Delete the file to rewrite it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"

__all__ = ["OUT", "ensure_random_llama_gguf"]


def ensure_random_llama_gguf(name: str, qtype: str, *, quantized_as: dict[str, str] | None = None,
                             **config: Any) -> Path:
    """``benchmarks/out/NAME``: a random Llama (``tiny_config`` overridden by ``config``) with every 2-D weight
    in ``qtype`` except the tensors ``quantized_as`` names (GGUF tensor name -> type name), written on first use."""
    sys.path.insert(0, str(REPO))
    from tests.helpers.gguf_files import Q, write_gguf
    from tests.helpers.hf_checkpoints import build_model, tiny_config

    path = OUT / name
    if path.exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    types = {tensor: Q[type_name] for tensor, type_name in (quantized_as or {}).items()}
    write_gguf(partial, build_model("llama", tiny_config("llama", **config)), "llama", qtype=Q[qtype],
               quantized_as=types)
    partial.rename(path)
    return path
