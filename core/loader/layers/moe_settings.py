"""A model's mixture-of-experts settings as one record, importable without torch (config parsing is light)."""

from __future__ import annotations

import attrs

__all__ = ["MoESettings"]


@attrs.frozen
class MoESettings:
    """A model's mixture-of-experts fields, read from its config by the model plugin.

    :ivar num_experts: experts per MoE layer (``num_local_experts``, ``num_experts``).
    :ivar top_k: experts per token (``num_experts_per_tok``).
    :ivar intermediate_size: one expert's intermediate size (``moe_intermediate_size``; Mixtral's
        ``intermediate_size``).
    :ivar renormalize: rescale the chosen routing weights to sum to one (``norm_topk_prob``).
    :ivar shared_expert_intermediate_size: Qwen2-MoE's shared expert (0: none).
    :ivar expert_names: the checkpoint's names for gate, down and up (``("w1", "w2", "w3")`` for Mixtral).
    """

    num_experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool
    shared_expert_intermediate_size: int = 0
    expert_names: tuple[str, str, str] = ("gate_proj", "down_proj", "up_proj")
