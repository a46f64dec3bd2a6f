"""The load step for formats named by parameter (sharded state, dummy): exact names, no mapping or slicing."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .._mapped_parameters import fill_parameter
from ..errors import UnexpectedWeightError
from ..weights import CheckpointTensor

__all__ = ["load_by_name"]


def load_by_name(model: nn.Module, weights: Iterable[tuple[str, CheckpointTensor]]) -> set[str]:
    """Copy each saved tensor into the parameter or buffer of the same name; return the names filled."""
    targets: dict[str, torch.Tensor] = {n: p for n, p in model.named_parameters()}
    for name, buf in model.named_buffers():
        targets.setdefault(name, buf)
    filled: set[str] = set()
    for name, tensor in weights:
        target = targets.get(name)
        if target is None:
            raise UnexpectedWeightError(
                f"{tensor.describe()}: the model has no parameter {name!r} (was the state saved from another "
                "model or loader version?)"
            )
        fill_parameter(target, tensor)
        filled.add(name)
    return filled
