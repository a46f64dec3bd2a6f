"""GGUF files of architectures no native plugin serves, written with gguf-py's ``GGUFWriter``.

A tiny random ``transformers`` model is converted the way llama.cpp's converter
does it: metadata under the keys transformers' GGUF tables read
(``GGUF_CONFIG_MAPPING``), tensors under gguf-py's names for the architecture,
with llama.cpp's value conventions (Gemma norms stored with ``+1`` folded in,
GPT-2 ``Conv1D`` weights transposed to ``(out, in)``). The fallback's tests load
each file through loader and through ``from_pretrained(..., gguf_file=...)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
from gguf import GGMLQuantizationType

from tests.helpers.gguf_files import add_weight, finish
from tests.helpers.hf_fallback_checkpoints import build_hf_model, fallback_config

Q = GGMLQuantizationType

GGUF_FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "phi3": ("phi3", {}),
    "stablelm": ("stablelm", {}),
    "gemma2": ("gemma2", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, max_position_embeddings=128, vocab_size=256,
                              bos_token_id=1, eos_token_id=2, pad_token_id=0)),
    "gpt2": ("gpt2", dict(n_positions=1024)),  # transformers reads context_length as n_ctx, sizes wpe by n_positions
}
"""GGUF architecture -> (transformers model_type, config overrides)."""

_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def _config_value(config: Any, field: str) -> Any:
    if field == "rope_theta":
        params = getattr(config, "rope_parameters", None) or {}
        return params.get("rope_theta", getattr(config, "rope_theta", None))
    if field == "n_ctx":
        return getattr(config, "n_ctx", None) or config.n_positions
    if field == "feed_forward_length":  # GPT-2: n_inner, 4 * n_embd when unset
        return getattr(config, "n_inner", None) or 4 * config.n_embd
    return getattr(config, field, None)


def _add_metadata(writer: gguf.GGUFWriter, arch: str, config: Any) -> None:
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    for key, field in GGUF_CONFIG_MAPPING[arch].items():
        value = None if field is None else _config_value(config, field)
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", int(value))
    writer.add_token_list([f"<t{i}>" for i in range(config.vocab_size)])  # transformers sizes GPT-2's vocab by it
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(0)


def _gguf_name(table: Any, hf_name: str) -> str:
    parts = hf_name.split(".")
    for depth in range(len(parts) - 1):
        stem, _, suffix = ".".join(parts[depth:]).rpartition(".")
        found = table.get_name(stem)
        if found is not None:
            return f"{found}.{suffix}"
    raise KeyError(f"gguf-py has no GGUF name for {hf_name}")


def write_fallback_gguf(path: Path, arch: str, *, qtype: GGMLQuantizationType = Q.F32, seed: int = 0,
                        extra_tensors: dict[str, np.ndarray] | None = None, split_max_tensors: int = 0) -> Any:
    """Write a random ``arch`` model as a GGUF file at ``path``; return the ``transformers`` model it came from.

    2-D weights are stored as ``qtype``; 1-D tensors (norms, biases) as F32, as llama.cpp does. With
    ``split_max_tensors`` gguf-py writes a split set ``<stem>-0000i-of-0000n.gguf`` beside ``path`` instead.
    """
    model_type, overrides = GGUF_FAMILIES[arch]
    model = build_hf_model(fallback_config(model_type, **overrides), seed=seed)
    config = model.config
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    table = gguf.get_tensor_name_map(arch_enum, layers)
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    _add_metadata(writer, arch, config)
    writer.add_file_type(int(qtype) if qtype != Q.F32 else 0)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and tied:
            continue
        name = _gguf_name(table, hf_name)
        values = tensor.detach().float().numpy()
        if arch == "gemma2" and name.endswith("norm.weight"):
            values = values + 1.0
        if arch == "gpt2" and hf_name.endswith(_CONV1D):
            values = np.ascontiguousarray(values.T)
        add_weight(writer, name, values, qtype)
    finish(writer, extra_tensors)
    return model
