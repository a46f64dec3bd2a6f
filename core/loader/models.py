"""Public: what a model plugin builds its classes with.

- :class:`ModelContext`, the one argument a model class is built from;
- the capability mixins the registry's probe reads (:class:`SupportsTensorParallel`,
  :class:`SupportsPipelineParallel`, :class:`SupportsQuantization`) and the
  :class:`CausalLM` protocol;
- the load in progress: :func:`current_session` (TP rank and size, dtype,
  device, plugin host) and :class:`LoadSession`;
- the collectives a model's forward may need (:func:`all_reduce`,
  :func:`all_gather`) and :func:`divide`, which names what does not divide.

Nothing here imports torch.
"""

from __future__ import annotations

from ._context import ModelContext
from ._distributed import all_gather, all_reduce, divide
from ._interfaces import CausalLM, SupportsPipelineParallel, SupportsQuantization, SupportsTensorParallel
from ._session import LoadSession, current_session

__all__ = [
    "CausalLM",
    "LoadSession",
    "ModelContext",
    "SupportsPipelineParallel",
    "SupportsQuantization",
    "SupportsTensorParallel",
    "all_gather",
    "all_reduce",
    "current_session",
    "divide",
]
