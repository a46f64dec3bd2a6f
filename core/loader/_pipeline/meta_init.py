"""torch's weight initialisers do nothing to a tensor on the meta device, so a build skips them.

A model is built on ``meta`` and every parameter is then filled from the checkpoint
(or materialised and initialised by the pipeline), so ``nn.Linear``'s
``kaiming_uniform_``, ``nn.Embedding``'s ``normal_`` and a model's own
``_init_weights`` compute nothing there. They still cost:
each dispatches into torch's meta kernels, whose first call faults their code
(part of ``libtorch_cpu``) into the process's resident memory.
Only meta tensors are skipped; an initialiser called on a
real tensor during a build (a buffer a model fills itself) runs as before.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.nn import init

__all__ = ["INITIALIZERS", "meta_initializer_target"]

INITIALIZERS = frozenset(
    getattr(init, name) for name in (
        "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
        "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_",
    ) if hasattr(init, name)
)
"""The in-place initialisers of ``torch.nn.init`` (each returns the tensor it filled)."""


def meta_initializer_target(func: Callable[..., Any], args: Sequence[Any],
                            kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The meta tensor ``func(*args, **kwargs)`` would initialise, or ``None`` when it is not that call.

    ``torch.nn.init`` hands its tensor to a function mode as the keyword ``tensor``.
    """
    if func not in INITIALIZERS:
        return None
    tensor = args[0] if args else kwargs.get("tensor")
    return tensor if isinstance(tensor, torch.Tensor) and tensor.is_meta else None
