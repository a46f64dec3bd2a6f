"""The mixture-of-experts fields of a GGUF file's synthesized HF config.

llama.cpp's converter writes ``{arch}.expert_count`` (``num_experts`` / Mixtral's ``num_local_experts``),
``{arch}.expert_used_count`` (``num_experts_per_tok``), ``{arch}.expert_feed_forward_length``
(``moe_intermediate_size``; Mixtral's experts are ``feed_forward_length`` wide and it writes none) and, for
Qwen2-MoE, ``{arch}.expert_shared_feed_forward_length`` (``shared_expert_intermediate_size``). It writes no
``norm_topk_prob``: llama.cpp's graphs fix it per architecture — the chosen weights are renormalised for
``llama`` (Mixtral) and ``qwen3moe``, not for ``qwen2moe`` — and so does this config, so a file computes what
llama.cpp computes from it. A ``llama`` file with experts is Mixtral (``MixtralForCausalLM``).

The expert count is checked against the 3-D expert tensors here, before a model is built: a file whose
metadata and tensors disagree is refused naming both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from loader.errors import ConfigError, UnsupportedError

from .experts import EXPERT_TENSOR

if TYPE_CHECKING:
    from .config import _Meta
    from .header import GGUFHeader

__all__ = ["MOE_ARCHITECTURES", "moe_fields"]

MOE_ARCHITECTURES = {"llama": "MixtralForCausalLM", "qwen2moe": "Qwen2MoeForCausalLM",
                     "qwen3moe": "Qwen3MoeForCausalLM"}
"""``general.architecture`` of a file with experts -> the HF architecture our model plugins register."""

_MODEL_TYPES = {"llama": "mixtral", "qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
_RENORMALISED = {"llama": True, "qwen2moe": False, "qwen3moe": True}
"""Whether llama.cpp's graph for the architecture renormalises the chosen experts' weights."""
_SOFTMAX = 1  # gguf.ExpertGatingFuncType.SOFTMAX, the only router these families use


def has_experts(header: GGUFHeader, meta: _Meta) -> bool:
    """Whether the file is a mixture of experts: a nonzero ``expert_count`` or any 3-D expert tensor."""
    count = meta.raw("expert_count")
    return bool(count) or any(EXPERT_TENSOR.match(t.name) for t in header.tensors)


def moe_fields(header: GGUFHeader, meta: _Meta, tensor_names: frozenset[str]) -> dict[str, Any] | None:
    """The HF config fields of a mixture-of-experts file (``architectures`` and ``model_type`` included), or
    ``None`` when the file has no experts.

    :raises ConfigError: ``expert_count`` missing beside expert tensors, or disagreeing with their shapes.
    :raises UnsupportedError: a router other than softmax, or scaled expert weights.
    """
    arch = meta.arch
    if arch not in MOE_ARCHITECTURES or not has_experts(header, meta):
        if arch in ("qwen2moe", "qwen3moe"):
            raise ConfigError(f"{header.path}: a {arch!r} file without '{arch}.expert_count' or expert tensors")
        return None
    experts = meta.integer("expert_count")
    _check_tensors(header, meta, experts)
    gating = meta.raw("expert_gating_func")
    if gating is not None and gating != _SOFTMAX:
        raise UnsupportedError(f"{header.path}: metadata key '{arch}.expert_gating_func' is {gating!r}; these "
                               "families route with a softmax (1)")
    scale = meta.raw("expert_weights_scale")
    if scale is not None and float(scale) not in (0.0, 1.0):
        raise UnsupportedError(f"{header.path}: metadata key '{arch}.expert_weights_scale' is {scale!r}; scaled "
                               "expert weights are not supported")
    fields: dict[str, Any] = {
        "architectures": [MOE_ARCHITECTURES[arch]],
        "model_type": _MODEL_TYPES[arch],
        "num_experts_per_tok": meta.integer("expert_used_count"),
    }
    if arch == "llama":
        fields["num_local_experts"] = experts
        fields["intermediate_size"] = meta.integer("expert_feed_forward_length", meta.integer("feed_forward_length"))
        fields["sliding_window"] = None
        return fields
    fields.update(num_experts=experts, moe_intermediate_size=meta.integer("expert_feed_forward_length"),
                  norm_topk_prob=_RENORMALISED[arch], decoder_sparse_step=1, mlp_only_layers=[],
                  use_sliding_window=False)
    if arch == "qwen2moe":
        fields["qkv_bias"] = "blk.0.attn_q.bias" in tensor_names
        shared = meta.raw("expert_shared_feed_forward_length")
        fields["shared_expert_intermediate_size"] = meta.integer("expert_shared_feed_forward_length") \
            if shared is not None else _shared_rows(header)
    else:
        fields["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    return fields


def _check_tensors(header: GGUFHeader, meta: _Meta, experts: int) -> None:
    """Every 3-D expert tensor of the header holds ``expert_count`` experts (dim 0 in torch order)."""
    for info in header.tensors:
        if EXPERT_TENSOR.match(info.name) and (len(info.shape) != 3 or info.shape[0] != experts):
            held = f"holds {info.shape[0]} experts" if len(info.shape) == 3 else "is not 3-D"
            raise ConfigError(f"{header.path}: metadata key '{meta.arch}.expert_count' is {experts} but tensor "
                              f"{info.name!r} {held} (shape {list(info.shape)}, experts outermost)")


def _shared_rows(header: GGUFHeader) -> int:
    """The shared expert's width from ``blk.0.ffn_gate_shexp`` (0: the file has no shared expert)."""
    info = next((t for t in header.tensors if t.name == "blk.0.ffn_gate_shexp.weight"), None)
    return int(info.shape[0]) if info is not None and len(info.shape) == 2 else 0
