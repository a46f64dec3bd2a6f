"""What a Q4_K_M-style GGUF holds once loaded: parameters and buffers per load mode, against the file size.

llama.cpp's Q4_K_M stores most linears as Q4_K but ``attn_v`` / ``ffn_down`` of about half the layers and the
untied output head as Q6_K, which torch's int4 kernel cannot take; those layers are dequantized. The file here
is a random Llama of that mix (hidden 768, 12 layers, vocabulary 32000; K-quant blocks random but valid, as
gguf-py cannot quantize K-quants), written once under ``benchmarks/out/``. Modes:

- ``auto`` (the default): packed Q4_K, the Q6_K layers dequantized to bfloat16;
- ``gguf+float32`` (``quantization="gguf", dtype="float32"``): packed Q4_K, the Q6_K layers in float32 — what
  ``auto`` held before fallback layers took the kernel's dtype;
- ``float32``: everything dequantized.

Usage: ``.venv/bin/python benchmarks/bench_gguf_k_m_memory.py``. Prints one Markdown table; asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
LAYERS = 12
MODES: dict[str, dict[str, Any]] = {
    "auto": {},
    "gguf+float32": {"quantization": "gguf", "dtype": "float32"},
    "float32": {"dtype": "float32"},
}


def k_m_file() -> Path:
    """The Q4_K_M-style file, written on first use (the layers llama.cpp's ``use_more_bits`` picks are Q6_K)."""
    sys.path.insert(0, str(REPO))
    from benchmarks.random_gguf import ensure_random_llama_gguf

    more_bits = [i for i in range(LAYERS) if i < LAYERS // 8 or i >= 7 * LAYERS // 8 or (i - LAYERS // 8) % 3 == 2]
    types = {f"blk.{i}.{name}.weight": "Q6_K" for i in more_bits for name in ("attn_v", "ffn_down")}
    types["output.weight"] = "Q6_K"
    return ensure_random_llama_gguf("llama-k-m-mix.gguf", "Q4_K", quantized_as=types, vocab_size=32000,
                                    hidden_size=768, intermediate_size=2048, num_hidden_layers=LAYERS,
                                    num_attention_heads=12, num_key_value_heads=4, rope_scaling=None)


def main() -> int:
    import loader

    path = k_m_file()
    file_mib = path.stat().st_size / 2**20
    print(f"{path.name}: {file_mib:.1f} MiB\n")
    print("| mode | kernels | parameters + buffers MiB | ÷ file | dequantized layers' dtype |")
    print("|---|---|---:|---:|---|")
    for mode, options in MODES.items():
        model, report = loader.load_model_with_report(str(path), **options)
        held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]) / 2**20
        quant = report.quantization or {}
        dtypes = sorted({str(r.get("dtype")) for r in quant.get("layers", {}).values() if r.get("dtype")})
        kernels = ", ".join(f"{k} {n}" for k, n in sorted(quant.get("kernels", {}).items())) or "dense"
        print(f"| {mode} | {kernels} | {held:.1f} | {held / file_mib:.2f}x | {', '.join(dtypes) or '—'} |")
        del model
    return 0


if __name__ == "__main__":
    sys.exit(main())
