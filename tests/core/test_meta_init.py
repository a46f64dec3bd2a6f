"""A model built on 'meta' skips torch's weight initialisers (they fill nothing there, yet fault kernel code in)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from loader._pipeline.factory_dtype import factory_dtype
from loader._pipeline.meta_init import INITIALIZERS, meta_initializer_target


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_meta_build_dispatches_no_initializer() -> None:
    with _Ops() as ops, factory_dtype(torch.bfloat16), torch.device("meta"):
        linear = nn.Linear(8, 4)
        embedding = nn.Embedding(10, 4)
    assert not [n for n in ops.names if "uniform_" in n or "normal_" in n], ops.names
    assert linear.weight.is_meta and linear.weight.dtype == torch.bfloat16
    assert embedding.weight.shape == (10, 4)


def test_an_initializer_on_a_real_tensor_still_runs_inside_a_build() -> None:
    with factory_dtype(torch.float32):
        buffer = torch.zeros(64, device="cpu")
        nn.init.normal_(buffer)
        nn.init.kaiming_uniform_(weight := torch.zeros(4, 8, device="cpu"))
    assert buffer.abs().sum() > 0
    assert weight.abs().sum() > 0


def test_only_initializers_on_meta_tensors_are_targets() -> None:
    meta = torch.empty(2, device="meta")
    assert meta_initializer_target(nn.init.normal_, (meta,), {}) is meta
    assert meta_initializer_target(nn.init.kaiming_uniform_, (), {"tensor": meta}) is meta
    assert meta_initializer_target(nn.init.normal_, (torch.empty(2),), {}) is None
    assert meta_initializer_target(torch.empty, (2,), {}) is None
    assert nn.init.xavier_uniform_ in INITIALIZERS
