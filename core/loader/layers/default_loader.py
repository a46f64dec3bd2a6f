"""The weight loader of parameters that need no sharding: check the shape, read into place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import ShapeMismatchError

if TYPE_CHECKING:
    import torch

    from ..weights import CheckpointTensor

__all__ = ["check_shape", "default_weight_loader"]


def check_shape(loaded: CheckpointTensor, expected: Sequence[int], what: str = "") -> None:
    """Raise :class:`ShapeMismatchError` unless ``loaded`` has shape ``expected``.

    ``what`` names the destination (a layer prefix, a shard) in the message.
    """
    expected = tuple(int(s) for s in expected)
    if tuple(loaded.shape) != expected:
        target = f" for {what}" if what else ""
        raise ShapeMismatchError(
            f"{loaded.describe()}: expected shape {expected}{target}, found {tuple(loaded.shape)}"
        )


def default_weight_loader(param: torch.Tensor, loaded: CheckpointTensor, shard_id: object = None) -> None:
    """Read ``loaded`` whole into ``param`` after checking the shapes agree.

    ``shard_id`` is accepted (and must be ``None``) so model code can call every
    parameter's loader the same way.
    """
    if shard_id is not None:
        raise ValueError(f"parameter of shape {tuple(param.shape)} has no shards, got shard_id={shard_id!r}")
    check_shape(loaded, param.shape)
    loaded.read_into(param.data)
