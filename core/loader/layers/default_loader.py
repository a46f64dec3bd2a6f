"""The weight loader of parameters that need no sharding: check the shape, read into place."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._mapped_parameters import fill_parameter
from ..weights import check_shape

if TYPE_CHECKING:
    import torch

    from ..weights import CheckpointTensor

__all__ = ["check_shape", "default_weight_loader"]


def default_weight_loader(param: torch.Tensor, loaded: CheckpointTensor, shard_id: object = None) -> None:
    """Read ``loaded`` whole into ``param`` after checking the shapes agree.

    ``shard_id`` is accepted (and must be ``None``) so model code can call every
    parameter's loader the same way.
    """
    if shard_id is not None:
        raise ValueError(f"parameter of shape {tuple(param.shape)} has no shards, got shard_id={shard_id!r}")
    check_shape(loaded, param.shape)
    fill_parameter(param, loaded)
