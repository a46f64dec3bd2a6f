"""A Hugging Face ``config.json``-shaped mapping built from GGUF metadata alone.

Keys are llama.cpp's (``{arch}.block_count``, ``{arch}.attention.head_count``, ...). Choices
made where the file is silent or differs from HF, each matching what ``transformers`` does
when it loads the same file, so logits agree:

* ``general.architecture`` ``llama`` covers Llama and Mistral (llama.cpp converts both to
  ``llama`` and stores no sliding window): both load as ``LlamaForCausalLM``; with experts it is
  Mixtral (``MixtralForCausalLM``); ``qwen2moe`` / ``qwen3moe`` are Qwen2-MoE / Qwen3-MoE, their expert
  fields read by :mod:`.moe_config`;
* floats (``rms_norm_eps``, ``rope_theta``) are stored as float32 and read back as the exact
  float32 value (``1e-5`` arrives as ``9.99999974e-06``), as ``transformers`` reads them;
* ``vocab_size`` is absent from Qwen2 files: the token list's length is used;
* ``tie_word_embeddings`` is true when the file has no ``output.weight``;
* ``torch_dtype`` is ``float32``, so ``dtype="auto"`` (the default for GGUF) computes in float32 as
  llama.cpp does: a GGUF file's unquantized tensors (norms, biases) are F32, and bfloat16 activations
  throughout make SmolLM2 drift (see :mod:`loader_plugin_gguf.packed.linear_method`); the quantized
  weights stay packed;
* Llama 3 rope scaling is recovered from the ``rope_freqs`` tensor (see :mod:`.rope_freqs`),
  where ``transformers`` drops it; linear and YaRN scaling come from ``rope.scaling.*``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loader.errors import ConfigError, UnknownArchitectureError, UnsupportedError
from loader.weights import ReadStats

from .header import GGUFHeader, GGUFStrings, read_header
from .moe_config import moe_fields
from .rope_freqs import llama3_scaling_from_divisors
from .tensors import GGUFTensor, MappedFile

__all__ = ["ARCHITECTURES", "ROTARY_PERMUTED", "attention_heads", "hf_config", "hf_config_of_files", "vocab_size"]

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen2moe": "Qwen2MoeForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM"}
"""``general.architecture`` -> the HF architecture our model plugins register (a ``llama`` file with experts:
``MixtralForCausalLM``)."""

ROTARY_PERMUTED = frozenset({"llama"})
"""Architectures whose q/k rows llama.cpp's converter interleaves for its rotary kernel."""

MAX_COUNT = 1 << 20  # bounds for sizes read from the file, far above any real model


class _Meta:
    """Typed access to ``{arch}.*`` metadata with errors naming the file and key."""

    def __init__(self, header: GGUFHeader) -> None:
        self.header = header
        self.arch = header.architecture
        self.values = header.metadata

    def raw(self, key: str) -> Any:
        return self.values.get(f"{self.arch}.{key}")

    def integer(self, key: str, default: int | None = None, *, minimum: int = 1) -> int:
        value = self.raw(key)
        if value is None:
            if default is None:
                raise ConfigError(f"{self.header.path}: metadata key '{self.arch}.{key}' is missing")
            return default
        if isinstance(value, np.ndarray):  # per-layer arrays: accept when uniform
            if value.size == 0 or not np.all(value == value.flat[0]):
                raise UnsupportedError(f"{self.header.path}: metadata key '{self.arch}.{key}' varies per "
                                       "layer, which these model families do not support")
            value = value.flat[0].item()
        if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_COUNT:
            raise ConfigError(f"{self.header.path}: metadata key '{self.arch}.{key}' is {value!r}; "
                              f"expected an integer in [{minimum}, {MAX_COUNT}]")
        return value

    def number(self, key: str) -> float | None:
        value = self.raw(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"{self.header.path}: metadata key '{self.arch}.{key}' is {value!r}; "
                              "expected a positive number")
        return float(value)


def attention_heads(header: GGUFHeader) -> tuple[int, int]:
    """``(query heads, key/value heads)`` from ``{arch}.attention.head_count(_kv)``."""
    meta = _Meta(header)
    heads = meta.integer("attention.head_count")
    return heads, meta.integer("attention.head_count_kv", heads)


def vocab_size(header: GGUFHeader) -> int:
    """``{arch}.vocab_size``, else the token list's length, else the embedding's rows."""
    meta = _Meta(header)
    declared = meta.raw("vocab_size")
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    embed = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    if declared is not None:
        size = meta.integer("vocab_size")
    elif isinstance(tokens, GGUFStrings | list):
        size = len(tokens)
    elif embed is not None:
        size = embed.shape[0]
    else:
        raise ConfigError(f"{header.path}: no '{meta.arch}.vocab_size', token list or token_embd.weight "
                          "to size the vocabulary from")
    if embed is not None and embed.shape[0] != size:
        raise ConfigError(f"{header.path}: the vocabulary has {size} entries but token_embd.weight has "
                          f"{embed.shape[0]} rows")
    return size


def _rope_scaling(header: GGUFHeader, meta: _Meta, theta: float, head_dim: int) -> dict[str, Any] | None:
    kind = meta.raw("rope.scaling.type")
    factor = meta.number("rope.scaling.factor")
    if kind is None and meta.raw("rope.scale_linear") is not None:  # files older than rope.scaling.*
        kind, factor = "linear", meta.number("rope.scale_linear")
    if kind == "linear" and factor is not None:
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn" and factor is not None:
        return {"rope_type": "yarn", "factor": factor,
                "original_max_position_embeddings": meta.integer("rope.scaling.original_context_length")}
    if kind not in (None, "none"):
        raise UnsupportedError(f"{header.path}: metadata key '{meta.arch}.rope.scaling.type' is {kind!r}; "
                               "supported: none, linear, yarn")
    info = next((t for t in header.tensors if t.name == "rope_freqs.weight"), None)
    if info is None:
        return None
    divisors = GGUFTensor(info, MappedFile(header.path), ReadStats()).read().reshape(-1)
    where = f"tensor 'rope_freqs.weight' in {header.path}"
    return llama3_scaling_from_divisors(divisors.tolist(), theta, head_dim, where)


def hf_config(header: GGUFHeader, tensor_names: frozenset[str] | None = None) -> dict[str, Any]:
    """The model configuration for ``header``'s file, shaped like a HF ``config.json``.

    ``tensor_names``: every tensor of a split set (``gguf-split`` keeps the metadata in the first part but
    puts tensors where they fall — an untied ``output.weight`` usually in the last); ``None``: the header's own.
    """
    meta = _Meta(header)
    arch = meta.arch
    if arch not in ARCHITECTURES:
        raise UnknownArchitectureError(
            f"{header.path}: GGUF architecture {arch!r} is not supported; supported: {', '.join(ARCHITECTURES)}"
        )
    hidden = meta.integer("embedding_length")
    heads, kv_heads = attention_heads(header)
    head_dim = meta.integer("attention.key_length", hidden // heads)
    if meta.integer("attention.value_length", head_dim) != head_dim:
        raise UnsupportedError(f"{header.path}: attention key and value lengths differ, which these model "
                               "families do not support")
    rotary = meta.integer("rope.dimension_count", head_dim)
    if rotary != head_dim:
        raise UnsupportedError(f"{header.path}: metadata key '{arch}.rope.dimension_count' is {rotary} but the "
                               f"head size is {head_dim}; partial rotary is not supported")
    theta = meta.number("rope.freq_base") or 10000.0
    names = header.tensor_names() if tensor_names is None else tensor_names
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": meta.integer("feed_forward_length"),
        "num_hidden_layers": meta.integer("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab_size(header),
        "rope_theta": theta,
        "rope_scaling": _rope_scaling(header, meta, theta, head_dim),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float32",
    }
    context = meta.raw("context_length")
    if context is not None:
        config["max_position_embeddings"] = meta.integer("context_length")
    eps = meta.number("attention.layer_norm_rms_epsilon")
    if eps is not None:
        config["rms_norm_eps"] = eps
    if arch == "llama":
        config["attention_bias"] = "blk.0.attn_q.bias" in names
    if arch == "qwen2":
        config["use_sliding_window"] = False
    config.update(moe_fields(header, meta, names) or {})
    for field, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                       ("pad_token_id", "padding_token_id")):
        value = header.metadata.get(f"tokenizer.ggml.{key}")
        if isinstance(value, int) and not isinstance(value, bool):
            config[field] = value
    return config



def hf_config_of_files(files: Sequence[str]) -> dict[str, Any]:
    """:func:`hf_config` of a GGUF file or split set: the first file's metadata, every file's tensor names (the
    headers are cached: the load reads them again)."""
    headers = [read_header(Path(file)) for file in files]
    return hf_config(headers[0], frozenset().union(*(header.tensor_names() for header in headers)))
