"""``send_weights``: the trainer's side of a weight transfer (the protocol is in :mod:`.transfer`).

The trainer holds full tensors; it packs them into buckets and broadcasts each
from its own rank. It takes part in every step of the protocol even when its
own input is bad (the header then carries its error), so the inference ranks
waiting on it fail with that error instead of waiting forever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from ..errors import LoadError
from .transfer import (
    DEFAULT_BUCKET_BYTES,
    Header,
    check_bucket_bytes,
    describe_errors,
    error_text,
    exchange_errors,
    group_members,
    pack,
    plan_buckets,
    transfer_device,
    weight_specs,
)

__all__ = ["send_weights"]


def _settle(errors: dict[int, str], own: LoadError | None, when: str) -> None:
    """Raise this process's own error, or one naming the other ranks' errors."""
    if own is not None:
        raise own
    if errors:
        raise LoadError(f"the weight transfer stopped {when}: {describe_errors(errors)}")


def send_weights(state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                 group: dist.ProcessGroup | None = None, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Broadcast ``state_dict``'s tensors from this process to the inference ranks of ``group``.

    Every other process of ``group`` calls :func:`loader.update_weights_from_distributed` at the same time,
    with ``src`` this process's rank, specs equal to :func:`loader.weight_specs` of the same tensors (any
    order) and the same ``bucket_bytes``.

    :param state_dict: ``(name, tensor)`` pairs under the checkpoint's names, full tensors, on any device.
    :param group: the ``torch.distributed`` group holding this process and the inference ranks (default:
        torch's default group).
    :param bucket_bytes: the most bytes broadcast at once (a larger tensor is sent alone); the receivers'
        extra memory is bounded by it.
    :returns: the bytes broadcast.
    :raises loader.LoadError: this process's bad input (after telling the receivers), or, by rank, the
        errors of the receivers that refused the tensors or failed to write them.
    """
    members = group_members(group, "send_weights")
    me = dist.get_rank()
    own: LoadError | None = None
    tensors: dict[str, torch.Tensor] = {}
    size = 0
    try:
        size = check_bucket_bytes(bucket_bytes)
        pairs = list(state_dict.items() if isinstance(state_dict, Mapping) else state_dict)
        header = Header(size, weight_specs(pairs))
        tensors = dict(pairs)
    except LoadError as exc:
        own, header = exc, Header(size, (), error_text(exc))
    dist.broadcast_object_list([header.to_wire()], src=me, group=group)
    _settle(exchange_errors(header.error, group, members), own, "before any tensor was sent")
    device = transfer_device(group)
    sent = 0
    for bucket in plan_buckets(header.specs, header.bucket_bytes):
        buffer = pack(bucket, tensors, device)
        dist.broadcast(buffer, src=me, group=group)
        sent += bucket.size
        del buffer  # before the next bucket is packed: one bucket at a time
    _settle(exchange_errors(None, group, members), None, "after every tensor was sent")
    return sent
