"""A user's tensor on its way into a loaded model: a checkpoint tensor that can also be a probe.

An update hands the model's own ``load_weights`` the same kind of handle a
load does, so every weight loader (fused parts, TP narrowing, tied weights,
quantize-on-load) applies unchanged. Narrowing is a view: a TP rank given a
full tensor copies only its shard, with the dtype converted in the copy, so no
second full copy is ever made.

A *probe* is the same handle in a mode that writes nothing: a weight loader
runs all its checks (names, shapes, fused parts, TP splits) and reaches the
point where it would write; ``read_into`` then checks the destination and
returns, and ``read`` (a quantize method about to quantize the values itself)
stops the loader with :class:`ProbeReached`, which the update's loader wrapper
catches. Probing every tensor first is how an update of a mapping of tensors
is validated whole before its first write.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import UnsupportedError
from ..weights import CheckpointTensor, EagerTensor

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

__all__ = ["ProbeReached", "UpdateTensor", "as_update_stream"]


class ProbeReached(Exception):
    """A probe reached the point where its values would be read: everything before it was checked."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class UpdateTensor(EagerTensor):
    """A tensor given to ``update_weights``; with ``probe=True``, nothing is ever written from it."""

    def __init__(self, tensor: torch.Tensor, name: str, *, probe: bool = False) -> None:
        super().__init__(tensor, name, "the update")
        self.probe = probe

    def describe(self) -> str:
        return f"tensor {self.name!r} of the update"

    def narrow(self, dim: int, start: int, length: int) -> UpdateTensor:
        dim = self.check_narrow(dim, start, length)
        return UpdateTensor(self.tensor.narrow(dim, start, length), self.name, probe=self.probe)

    def as_probe(self) -> UpdateTensor:
        """The same values as a probe."""
        return UpdateTensor(self.tensor, self.name, probe=True)

    def check_lands(self, dtype: torch.dtype) -> None:
        """Refuse values that cannot become ``dtype`` without changing their meaning (float <-> integer)."""
        if self.dtype.is_floating_point != dtype.is_floating_point or self.dtype.is_complex:
            raise UnsupportedError(
                f"{self.describe()} holds {_dtype_name(self.dtype)} values, which cannot be written into a "
                f"{_dtype_name(dtype)} parameter; give {'floating point' if dtype.is_floating_point else 'integer'}"
                " values"
            )

    def read(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        if self.probe:
            raise ProbeReached(self.name)
        if dtype is not None:
            self.check_lands(dtype)
        return super().read(dtype)

    def read_into(self, out: torch.Tensor) -> None:
        self.check_destination(out)
        self.check_lands(out.dtype)
        if not self.probe:
            super().read_into(out)


def as_update_stream(items: Iterable[tuple[str, object]], *, probe: bool = False
                     ) -> Iterator[tuple[str, CheckpointTensor]]:
    """``(name, value)`` pairs as ``(name, checkpoint tensor)``; a value that is no tensor is refused by name.

    A :class:`~loader.weights.CheckpointTensor` passes through as it is (it cannot be probed: such a stream is
    checked tensor by tensor as it is written).
    """
    for name, value in items:
        if not isinstance(name, str):
            raise UnsupportedError(f"update_weights takes (name, tensor) pairs; found a name {name!r}, not a string")
        if isinstance(value, torch.Tensor):
            yield name, UpdateTensor(value.detach(), name, probe=probe)
        elif isinstance(value, CheckpointTensor) and not probe:
            yield name, value
        else:
            raise UnsupportedError(
                f"the value given for {name!r} is a {type(value).__name__}, not a torch.Tensor")
