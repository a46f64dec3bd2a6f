"""Tiny mixture-of-experts GGUF files written with gguf-py, laid out as llama.cpp's converter lays them out.

The converter itself (:mod:`tests.helpers.llamacpp_converter`) writes only F32/F16/BF16/Q8_0 and needs a
tokenizer it recognises; this writer covers what it cannot: Q4_0/Q4_1/Q4_K experts (packed by the loader)
and damaged files (an expert tensor of the wrong shape, ``expert_count`` disagreeing with the tensors). The
layout is the converter's, checked against its files in ``tests/plugins/gguf/test_moe_converted.py``:
``{arch}.expert_count`` / ``expert_used_count`` / ``expert_feed_forward_length`` (Qwen) and
``expert_shared_feed_forward_length`` (Qwen2-MoE); per layer the router ``ffn_gate_inp``, the 3-D
``ffn_{gate,up,down}_exps`` (experts outermost), Qwen2-MoE's ``ffn_*_shexp`` and its one-row gate
``ffn_gate_inp_shexp`` ``[1, hidden]``; Mixtral's q/k rows interleaved as for Llama.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.helpers.gguf_files import Q, add_weight, bpe_vocab, encode, finish, interleave_rotary

__all__ = ["GGUF_MOE_ARCH", "write_moe_gguf"]

GGUF_MOE_ARCH = {"mixtral": "llama", "qwen2_moe": "qwen2moe", "qwen3_moe": "qwen3moe"}
_ROUTED = {"gate_up_proj", "down_proj"}


def _metadata(writer: gguf.GGUFWriter, config: Any, family: str, expert_count: int) -> None:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float((getattr(config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_expert_count(expert_count)
    writer.add_expert_used_count(config.num_experts_per_tok)
    if family == "mixtral":
        writer.add_vocab_size(config.vocab_size)
        writer.add_rope_dimension_count(head_dim)
    else:
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if family == "qwen2_moe":
        writer.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    if family == "qwen3_moe":
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    tokens, types, merges = bpe_vocab(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)


def _experts(writer: gguf.GGUFWriter, layer: int, name: str, values: np.ndarray, qtype: Q,
             shapes: dict[str, tuple[int, ...]]) -> None:
    """The layer's 3-D expert tensors (``transformers`` holds gate and up fused, the converter splits them)."""
    parts = {"gate": values[:, : values.shape[1] // 2], "up": values[:, values.shape[1] // 2:]} \
        if name == "gate_up_proj" else {"down": values}
    for part, stack in parts.items():
        gguf_name = f"blk.{layer}.ffn_{part}_exps.weight"
        if gguf_name in shapes:  # a damaged file: other experts or rows than the model's
            stack = np.resize(stack, shapes[gguf_name]).astype(np.float32)
        experts, rows, cols = stack.shape
        if qtype == Q.F32:
            writer.add_tensor(gguf_name, np.ascontiguousarray(stack, dtype=np.float32))
        else:
            blocks = encode(stack.reshape(experts * rows, cols), qtype)
            writer.add_tensor(gguf_name, blocks.reshape(experts, rows, -1), raw_dtype=qtype)


def write_moe_gguf(path: Path, model: Any, family: str, *, qtype: Q = Q.F32, expert_count: int | None = None,
                   shapes: dict[str, tuple[int, ...]] | None = None) -> Path:
    """Convert the tiny ``transformers`` MoE ``model`` (``mixtral``, ``qwen2_moe`` or ``qwen3_moe``) to ``path``.

    :param qtype: the type of 2-D weights and expert tensors (norms, routers and gates stay F32, as
        llama.cpp keeps them); K-quants are random valid blocks (:func:`tests.helpers.gguf_files.encode`).
    :param expert_count: the metadata's ``expert_count`` (default: the model's).
    :param shapes: GGUF expert tensor name -> another shape to store it as (damaged files).
    """
    config = model.config
    arch = GGUF_MOE_ARCH[family]
    experts = config.num_local_experts if family == "mixtral" else config.num_experts
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch)
    _metadata(writer, config, family, experts if expert_count is None else expert_count)
    for hf_name, tensor in model.state_dict().items():
        values = tensor.detach().float().numpy()
        module, _, suffix = hf_name.rpartition(".")
        if suffix in _ROUTED:  # transformers 5 holds a layer's experts fused: ``mlp.experts.gate_up_proj``
            _experts(writer, int(hf_name.split(".")[2]), suffix, values, qtype, shapes or {})
            continue
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        gguf_name = names.get_name(module)
        if gguf_name is None:
            raise KeyError(f"gguf-py has no GGUF name for {hf_name}")
        if family == "mixtral" and module.endswith(("q_proj", "k_proj")):
            heads = config.num_attention_heads if module.endswith("q_proj") else config.num_key_value_heads
            values = interleave_rotary(values, heads)
        if module.endswith(("mlp.gate", "shared_expert_gate")):  # routers and gates stay F32, 2-D
            writer.add_tensor(f"{gguf_name}.{suffix}", values.astype(np.float32))
            continue
        add_weight(writer, f"{gguf_name}.{suffix}", values, qtype)
    finish(writer, None)
    return path
