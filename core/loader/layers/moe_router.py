"""From router logits to each token's experts and their weights (top-k routing).

The families loader knows route alike: a softmax over every expert's logit
(in float32), then the ``top_k`` largest probabilities; Mixtral and Qwen3-MoE
models with ``norm_topk_prob`` renormalise those to sum to one, Qwen2-MoE by
default does not. The weights stay float32 so the weighted sum of expert
outputs is taken at the precision ``transformers`` takes it.
"""

from __future__ import annotations

import attrs
import torch

__all__ = ["TopKRouting", "select_experts"]


@attrs.frozen
class TopKRouting:
    """How a layer's router picks experts.

    :ivar top_k: experts per token (``num_experts_per_tok``).
    :ivar renormalize: rescale the chosen probabilities to sum to one
        (``norm_topk_prob``; always for Mixtral).
    """

    top_k: int
    renormalize: bool


def select_experts(router_logits: torch.Tensor, routing: TopKRouting) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weights, ids)``, both ``[tokens, top_k]``: float32 weights and the global ids of the chosen experts.

    Ties go to the lower expert id (``torch.topk``'s order, as ``transformers``).
    """
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, routing.top_k, dim=-1)
    if routing.renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids
