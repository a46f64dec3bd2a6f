"""Tensor names of Mistral's ``consolidated.safetensors``, mapped onto Hugging Face's.

Besides the names, the native files keep the query and key projections in
the interleaved rotary layout (each head's rotary pairs adjacent: ``x0, y0,
x1, y1, ...``), as Meta's original Llama files do, while the rotary embedding
here rotates the half-split layout. ``transformers``' conversion script
permutes rows ``(head, pair, 2) -> (head, 2, pair)``; the same permutation is
applied here lazily with :func:`loader.weights.interleaved_to_half_rotary`,
so a tensor-parallel rank still reads only the rows of its own heads.

The renaming happens on the format side, as GGUF's does: detection
(:func:`native_weight_format`) returns the folder's safetensors files with
:class:`NativeNames` as the format's renaming step, which the core applies to
the stream before its duplicate-name check. The model sees Hugging Face names only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import attrs

from loader.checkpoint import Source, WeightFormat, side_file
from loader.weights import CheckpointTensor, WeightStream, interleaved_to_half_rotary

from .consolidated import NATIVE_CONFIG, is_consolidated

__all__ = ["NativeNames", "native_to_hf_name", "native_to_hf_weights", "native_weight_format"]

SAFETENSORS = "safetensors"

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


@attrs.frozen
class NativeNames:
    """The renaming step of a native folder's format: names mapped, q/k rows un-interleaved.

    Head counts come from the load's configuration (translated from ``params.json``).
    """

    def __call__(self, weights: WeightStream, hf_config: Mapping[str, Any]) -> WeightStream:
        from .model import parse_mistral_config

        config = parse_mistral_config(hf_config)
        return native_to_hf_weights(weights, config.num_attention_heads, config.num_key_value_heads)


def native_weight_format(source: Source, requested: str) -> WeightFormat | None:
    """The ``consolidated*.safetensors`` files of a native folder (``params.json``, no ``config.json``).

    They are read by whichever plugin reads the ``safetensors`` format; the
    format carries :class:`NativeNames`. ``None`` for any other source.
    """
    folder = source.directory
    if requested not in ("auto", SAFETENSORS) or folder is None or source.path is None:
        return None
    # the same files, judged by the same rule, as the native config reader: a link out of the folder is refused
    if side_file(folder, NATIVE_CONFIG) is None or side_file(folder, "config.json") is not None:
        return None
    candidates = [source.path] if source.path.is_file() else sorted(folder.iterdir())
    files = tuple(str(p) for p in candidates if is_consolidated(p.name) and p.is_file())
    if not files:
        return None
    index = side_file(folder, "consolidated.safetensors.index.json")
    return WeightFormat(SAFETENSORS, files, index=str(index) if index else None, renaming=NativeNames())
