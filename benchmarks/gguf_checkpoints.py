"""A 1 GB-class random Llama as GGUF (Q4_0 or Q4_K), written once with gguf-py under ``benchmarks/out/``.

The shape is the 1 GB checkpoint of the load benchmarks (``checkpoints.shape_for_size(1.0)``: hidden 2048, 16
heads / 4 KV heads, 8 layers, ~1 GB in bfloat16), with SmolLM2's vocabulary (49152) so the file carries a
real tokenizer — copied from the SmolLM2 GGUF's metadata — that llama.cpp and loader both read. Weights are
random normal (std 0.02); what is measured is speed and memory, not the text.

Every 2-D weight (embedding and untied output head included) is stored in the chosen type, norms in F32:
- Q4_0: ``gguf.quants.quantize`` of the random float rows, as ``convert_hf_to_gguf.py`` does;
- Q4_K: gguf-py has no K-quant quantizer (0.19 only dequantizes them), so the blocks are random but valid
  (each super-block's ``d``/``dmin`` a small float16, random 6-bit sub-scales and 4-bit codes) — the bytes
  llama.cpp and loader decode are the same bytes, which is all a speed comparison needs.

The file is checked by size and a marker; delete ``benchmarks/out/llama-1gb-*.gguf`` to rewrite it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoints import LlamaShape, shape_for_size

__all__ = ["QTYPES", "ensure_gguf_llama", "ensure_warm_up_gguf"]

QTYPES = ("Q4_0", "Q4_K")
_STD = 0.02


def _shape() -> LlamaShape:
    base = shape_for_size(1.0)
    return LlamaShape(base.hidden, base.intermediate, base.heads, base.kv_heads, base.layers, vocab=49152)


def _tokenizer_fields(smollm2: Path) -> list[tuple[str, Any, Any]]:
    """``(key, value, GGUFValueType)`` of every ``tokenizer.*`` field of the SmolLM2 file."""
    import gguf

    reader = gguf.GGUFReader(smollm2)
    fields: list[tuple[str, Any, Any]] = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            fields.append((key, list(field.contents()), field.types[-1]))
        else:
            fields.append((key, field.contents(), kind))
    return fields


def _quantized(rng: np.random.Generator, rows: int, cols: int, qtype: str) -> np.ndarray:
    import gguf

    kind = gguf.GGMLQuantizationType[qtype]
    if qtype == "Q4_0":
        values = rng.standard_normal((rows, cols), dtype=np.float32) * _STD
        return gguf.quants.quantize(values, kind)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    n_blocks = rows * cols // block
    blocks = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    # d and dmin (the first two float16 of a Q4_K super-block): small and finite, so values stay ~N(0, 0.02)
    scales = (np.abs(rng.standard_normal((n_blocks, 2))) * 2e-3).astype(np.float16)
    blocks[:, 0:4] = scales.view(np.uint8)
    return blocks.reshape(rows, -1)


def ensure_warm_up_gguf(out_dir: Path, smollm2: Path) -> Path:
    """A one-layer Llama (hidden 64, Q4_0, SmolLM2's tokenizer) that a benchmark loads before the one it times.

    Why: the timed load should find the library as a serving process does — imported, plugins discovered,
    kernels initialised — on both sides (loader and llama.cpp each load this file first), without the
    measured file's own header or pages cached by an earlier load of it.
    """
    shape = LlamaShape(64, 128, 4, 2, 1, vocab=49152)
    return ensure_gguf_llama(out_dir, "Q4_0", smollm2, shape=shape, stem="llama-warm-up")


def ensure_gguf_llama(out_dir: Path, qtype: str, smollm2: Path, *, shape: LlamaShape | None = None,
                      stem: str = "llama-1gb") -> Path:
    """The path of the 1 GB-class Llama (or ``shape``) in ``qtype``, writing it first when missing."""
    import gguf

    if qtype not in QTYPES:
        raise ValueError(f"qtype must be one of {QTYPES}, found {qtype!r}")
    shape = shape or _shape()
    path = out_dir / f"{stem}-{qtype.lower()}.gguf"
    marker = path.with_suffix(".complete")
    spec = json.dumps({"shape": shape.__dict__, "qtype": qtype, "std": _STD})
    if path.exists() and marker.exists() and marker.read_text() == spec:
        return path
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(17)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name(f"random {stem} {qtype}")
    writer.add_context_length(4096)
    writer.add_embedding_length(shape.hidden)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType[f"MOSTLY_{qtype}_M" if qtype == "Q4_K" else f"MOSTLY_{qtype}"])
    for key, value, kind in _tokenizer_fields(smollm2):
        if isinstance(value, list):
            writer.add_array(key, value)
        else:
            writer.add_key_value(key, value, kind)
    kind = gguf.GGMLQuantizationType[qtype]
    h, kv, inter = shape.hidden, shape.kv_heads * shape.head_dim, shape.intermediate
    matrices = [("token_embd.weight", shape.vocab, h)]
    for i in range(shape.layers):
        matrices += [(f"blk.{i}.attn_q.weight", h, h), (f"blk.{i}.attn_k.weight", kv, h),
                     (f"blk.{i}.attn_v.weight", kv, h), (f"blk.{i}.attn_output.weight", h, h),
                     (f"blk.{i}.ffn_gate.weight", inter, h), (f"blk.{i}.ffn_up.weight", inter, h),
                     (f"blk.{i}.ffn_down.weight", h, inter)]
    matrices.append(("output.weight", shape.vocab, h))
    for name, rows, cols in matrices:
        writer.add_tensor(name, _quantized(rng, rows, cols, qtype), raw_dtype=kind)
    ones = np.ones(h, dtype=np.float32)
    for i in range(shape.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
    writer.add_tensor("output_norm.weight", ones)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    marker.write_text(spec)
    return path
