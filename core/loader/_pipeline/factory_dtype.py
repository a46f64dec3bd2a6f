"""Tensor factories default to the load's dtype while a model is built, in this thread only.

The core's layers read the session's dtype (:func:`loader._session.current_session`),
but a model class written as for vLLM may create parameters with
``torch.empty(shape)`` and expect the load's dtype. Making that dtype torch's
default (``torch.set_default_dtype``) changes a process global, which two loads
in two threads interleave: one thread's restore leaves the other's dtype behind.
A torch function mode lives on a per-thread stack (as ``with torch.device("meta")``
does), so this one gives factories the dtype for the build in progress only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from .meta_init import meta_initializer_target

__all__ = ["factory_dtype"]

# Factories whose floating result takes torch's default dtype when no dtype is given.
_DEFAULTED = {torch.empty, torch.empty_strided, torch.zeros, torch.ones, torch.rand, torch.randn,
              torch.eye, torch.linspace, torch.logspace}
# Factories that infer their dtype from their arguments: a floating result in the default dtype is converted.
_INFERRED = {torch.full, torch.arange, torch.tensor, torch.scalar_tensor}


class _FactoryDtype(TorchFunctionMode):
    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func: Callable[..., Any], types: Sequence[type], args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        skipped = meta_initializer_target(func, args, kwargs)
        if skipped is not None:
            return skipped  # what the initialiser returns: its tensor, which on 'meta' holds nothing to fill
        if kwargs.get("dtype") is not None or (func not in _DEFAULTED and func not in _INFERRED):
            return func(*args, **kwargs)  # every other torch call of the build passes straight through
        if func in _DEFAULTED:
            return func(*args, **{**kwargs, "dtype": self.dtype})
        result = func(*args, **kwargs)
        if (func in _INFERRED and isinstance(result, torch.Tensor) and result.dtype == torch.get_default_dtype()
                and not (args and isinstance(args[0], torch.Tensor))):
            return result.to(self.dtype)
        return result


@contextmanager
def factory_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Inside the block, in this thread, tensor factories given no dtype create ``dtype`` floats."""
    with _FactoryDtype(dtype):
        yield
