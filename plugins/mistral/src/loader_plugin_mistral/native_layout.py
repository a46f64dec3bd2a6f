"""Tensor names of Mistral's ``consolidated.safetensors``, mapped onto Hugging Face's.

Besides the names, the native files keep the query and key projections in
the interleaved rotary layout (each head's rotary pairs adjacent: ``x0, y0,
x1, y1, ...``), as Meta's original Llama files do, while the rotary embedding
here rotates the half-split layout. ``transformers``' conversion script
permutes rows ``(head, pair, 2) -> (head, 2, pair)``; the same permutation is
applied here lazily with :func:`loader.weights.interleaved_to_half_rotary`,
so a tensor-parallel rank still reads only the rows of its own heads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from loader.weights import CheckpointTensor, interleaved_to_half_rotary

__all__ = ["native_to_hf_name", "native_to_hf_weights"]

_TOP_LEVEL = {
    "tok_embeddings": "model.embed_tokens",
    "norm": "model.norm",
    "output": "lm_head",
}
_IN_LAYER = {
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w2": "mlp.down_proj",
    "feed_forward.w3": "mlp.up_proj",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)\.([^.]+)$")
_ROTARY_LEAVES = ("weight", "bias")


def native_to_hf_name(name: str) -> tuple[str, str | None]:
    """``(hf_name, rotary)``: ``rotary`` is ``"q"`` or ``"k"`` when the rows need un-interleaving.

    Names that are not native come back unchanged (the model then reports
    them as unexpected, by their own name).
    """
    match = _LAYER.match(name)
    if match is not None:
        index, module, leaf = match.groups()
        mapped = _IN_LAYER.get(module)
        if mapped is None:
            return name, None
        rotary = None
        if leaf in _ROTARY_LEAVES and module in ("attention.wq", "attention.wk"):
            rotary = "q" if module == "attention.wq" else "k"
        return f"model.layers.{index}.{mapped}.{leaf}", rotary
    module, _, leaf = name.rpartition(".")
    if module in _TOP_LEVEL:
        return f"{_TOP_LEVEL[module]}.{leaf}", None
    return name, None


def native_to_hf_weights(
    weights: Iterable[tuple[str, CheckpointTensor]], num_heads: int, num_kv_heads: int
) -> Iterator[tuple[str, CheckpointTensor]]:
    """Rename a native stream and wrap q/k projections in the rotary row permutation."""
    for name, tensor in weights:
        hf_name, rotary = native_to_hf_name(name)
        if rotary == "q":
            tensor = interleaved_to_half_rotary(tensor, num_heads)
        elif rotary == "k":
            tensor = interleaved_to_half_rotary(tensor, num_kv_heads)
        yield hf_name, tensor
