"""A tiny model class registered by in-process test plugins (not a test module)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from loader._context import ModelContext
from loader._interfaces import SupportsTensorParallel
from loader.errors import UnexpectedWeightError
from loader.weights import CheckpointTensor


def _loader(param: torch.Tensor, loaded: CheckpointTensor) -> None:
    loaded.read_into(param.data)


class TinyForCausalLM(nn.Module, SupportsTensorParallel):
    is_text_generation_model = True

    def __init__(self, ctx: ModelContext) -> None:
        super().__init__()
        vocab, hidden = int(ctx.hf_config["vocab_size"]), int(ctx.hf_config["hidden_size"])
        self.embed = nn.Parameter(torch.empty(vocab, hidden), requires_grad=False)
        self.head = nn.Parameter(torch.empty(vocab, hidden), requires_grad=False)
        for p in (self.embed, self.head):
            p.weight_loader = _loader  # type: ignore[attr-defined]
        self.dtype = ctx.dtype

    def load_weights(self, weights: Iterable[tuple[str, CheckpointTensor]]) -> set[str]:
        params = dict(self.named_parameters())
        done = set()
        for name, tensor in weights:
            key = name.removesuffix(".weight")
            if key not in params:
                raise UnexpectedWeightError(f"{tensor.describe()}: no parameter for it")
            params[key].weight_loader(params[key], tensor)  # type: ignore[attr-defined]
            done.add(key)
        return done

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return (self.embed[input_ids] @ self.head.T).float()
