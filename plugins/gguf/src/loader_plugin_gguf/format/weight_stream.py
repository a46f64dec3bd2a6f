"""The GGUF weight iterator: HF names paired with lazily dequantized tensors.

For every tensor of every file (split sets in order) it maps the GGUF name to the HF name
(:mod:`.names`), undoes the q/k row interleave llama.cpp applies to Llama-family rotary
projections (lazily, with :func:`loader.weights.interleaved_to_half_rotary`, so a TP rank
still reads only its own heads), skips precomputed rotary tables, and refuses tensors whose
ggml type cannot be dequantized before anything is read. A mixture-of-experts layer's 3-D
tensors of every expert come out as one 2-D tensor per expert, under the per-expert names
``transformers`` writes (:mod:`.experts`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

from loader.errors import UnsupportedError
from loader.weights import CheckpointTensor, ReadStats, interleaved_to_half_rotary

from .config import ARCHITECTURES, ROTARY_PERMUTED, attention_heads
from .dequantize import SUPPORTED_TYPES, is_supported
from .experts import EXPERT_TENSOR, RowVector, split_experts
from .header import GGUFHeader, read_header
from .names import name_mapper
from .tensors import GGUFTensor, MappedFile

__all__ = ["iter_gguf_weights"]


def iter_gguf_weights(files: Sequence[str], stats: ReadStats) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield ``(hf_name, tensor)`` for each model tensor of the GGUF ``files`` (first file: metadata)."""
    headers = [read_header(Path(f)) for f in files]
    first = headers[0]
    arch = first.architecture
    if arch not in ARCHITECTURES:  # read for the transformers fallback, which maps the GGUF names itself
        yield from _iter_under_gguf_names(headers, stats)
        return
    blocks = first.metadata.get(f"{arch}.block_count")
    mapper = name_mapper(arch, blocks if isinstance(blocks, int) else 0)
    permuted = arch in ROTARY_PERMUTED
    heads, kv_heads = attention_heads(first) if permuted else (0, 0)
    count = first.metadata.get(f"{arch}.expert_count")
    expert_count = count if isinstance(count, int) and not isinstance(count, bool) else None
    for header in headers:
        mapped = MappedFile(header.path)
        for info in header.tensors:
            if mapper.is_skipped(info.name):
                continue
            hf = mapper.hf_name(info.name, str(header.path))
            if not is_supported(info.ggml_type):
                raise UnsupportedError(
                    f"tensor {info.name!r} in {header.path}: ggml type {info.type_name} cannot be "
                    f"dequantized; supported: {', '.join(SUPPORTED_TYPES)}"
                )
            if EXPERT_TENSOR.match(info.name):
                yield from split_experts(info, mapped, stats, hf, expert_count)
                continue
            tensor: CheckpointTensor = GGUFTensor(info, mapped, stats, hf)
            if hf.endswith(".shared_expert_gate.weight") and len(info.shape) == 1:
                tensor = RowVector(tensor)  # the one-row gate stored as a vector
            elif permuted and ".self_attn.q_proj." in hf:
                tensor = interleaved_to_half_rotary(tensor, heads)
            elif permuted and ".self_attn.k_proj." in hf:
                tensor = interleaved_to_half_rotary(tensor, kv_heads)
            yield hf, tensor


def _iter_under_gguf_names(headers: Sequence[GGUFHeader], stats: ReadStats) -> Iterator[tuple[str, CheckpointTensor]]:
    """Every tensor under its GGUF name: an architecture no native model serves.

    Its config came from the transformers fallback (the GGUF plugin refuses to
    build one), which renames the tensors through transformers' GGUF tables.
    """
    for header in headers:
        mapped = MappedFile(header.path)
        for info in header.tensors:
            if not is_supported(info.ggml_type):
                raise UnsupportedError(
                    f"tensor {info.name!r} in {header.path}: ggml type {info.type_name} cannot be "
                    f"dequantized; supported: {', '.join(SUPPORTED_TYPES)}"
                )
            yield info.name, GGUFTensor(info, mapped, stats)
