"""Run only the experts the tokens chose: tokens grouped by expert, one matmul pair per expert hit.

A dense all-experts compute costs ``num_experts / top_k`` times the work
(16x for Qwen3-30B-A3B's 128 experts, 8 chosen). Here the ``tokens x top_k``
choices are sorted by expert once; each expert that at least one token chose
runs on exactly its tokens (a prefill batches them, a decode step runs
``top_k`` experts on one row). Weighted outputs are written in expert order
into one float32 buffer, put back in choice order with one index copy and
summed over each token's ``top_k`` choices — no scatter-add, which torch runs
slowly for half-precision rows on the CPU; the float32 sum keeps bf16 models
as close to ``transformers`` as its own float32 accumulation. Choices of experts another rank holds
(expert parallelism) arrive as ``-1`` and are skipped: that rank adds them.
Quantized methods reuse this with their own per-expert forward.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["ExpertForward", "run_chosen_experts"]

ExpertForward = Callable[[int, torch.Tensor], torch.Tensor]
"""``forward(local_expert, rows)``: expert ``local_expert`` applied to ``rows`` ``[n, hidden]`` -> ``[n, hidden]``."""


def run_chosen_experts(x: torch.Tensor, weights: torch.Tensor, local_ids: torch.Tensor, num_local_experts: int,
                       expert_forward: ExpertForward) -> torch.Tensor:
    """``sum_k weights[t, k] * expert[local_ids[t, k]](x[t])`` for every token ``t``, in ``x``'s dtype.

    :param x: ``[tokens, hidden]``.
    :param weights: ``[tokens, top_k]`` routing weights (float32).
    :param local_ids: ``[tokens, top_k]`` indices into this rank's experts, ``-1`` for experts held elsewhere.
    :param num_local_experts: the experts this rank holds.
    :param expert_forward: one expert's forward on a group of rows.
    """
    tokens_count, top_k = local_ids.shape
    flat = local_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # bin 0 counts the choices held elsewhere (-1), bin e + 1 those of local expert e
    counts = torch.bincount(flat + 1, minlength=num_local_experts + 1).tolist()
    sorted_weights = weights.reshape(-1).index_select(0, order).unsqueeze(-1)
    # each choice's weighted output, in expert order: choices held elsewhere (first, -1 sorts lowest) stay zero
    by_expert = x.new_zeros(flat.numel(), x.shape[-1], dtype=torch.float32)
    start = counts[0]
    for expert, count in enumerate(counts[1:]):
        if not count:
            continue
        chosen = order[start:start + count]
        rows = expert_forward(expert, x.index_select(0, chosen // top_k))
        by_expert[start:start + count] = rows * sorted_weights[start:start + count]
        start += count
    per_choice = torch.empty_like(by_expert).index_copy_(0, order, by_expert)
    return per_choice.view(tokens_count, top_k, -1).sum(dim=1).to(x.dtype)
