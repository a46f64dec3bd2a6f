"""The wire protocol of a weight transfer from a trainer rank to inference ranks over ``torch.distributed``.

One transfer is four steps, run by every process of the group in the same order, so that an error on any of
them is known to all and nobody waits on a collective the others have left:

1. *header*: the sender broadcasts (``broadcast_object_list``) its bucket size and what it will send, each
   tensor's name, shape and dtype in sending order (:class:`WeightSpec`), or the error that stops it;
2. *verdict*: every process gathers every other's error, or ``None`` (``all_gather_object``): a receiver checks
   the header against the ``specs`` it was given and its model, before anything is sent;
3. *buckets*: tensors are packed, in header order, into byte buffers of at most ``bucket_bytes`` (a tensor larger
   than that travels alone), each aligned to :data:`ALIGNMENT` bytes, and broadcast one buffer at a time;
4. *outcome*: every process gathers every other's error again, so the sender learns whether the writes succeeded.

The layout of step 3 is computed on both sides from the header alone (:func:`plan_buckets`): nothing but raw
bytes crosses the wire after it. A receiver holds one bucket at a time, so the peak extra memory of a transfer
is one bucket's bytes (the larger of ``bucket_bytes`` and the largest tensor).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs
import torch
import torch.distributed as dist

from ..errors import ConfigError, LoadError, UnsupportedError

__all__ = ["ALIGNMENT", "DEFAULT_BUCKET_BYTES", "Bucket", "Header", "WeightSpec", "check_bucket_bytes", "check_specs",
           "describe_errors", "disagreement", "error_text", "exchange_errors", "group_members", "pack", "plan_buckets",
           "transfer_device", "unpack", "weight_specs"]

DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024
"""Bytes per bucket unless told: large enough that a broadcast's fixed cost is small, small beside a model."""

ALIGNMENT = 64
"""Where each tensor starts in a bucket: a multiple of this many bytes, so its bytes view as any dtype."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _shape(sizes: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(size) for size in sizes)


@attrs.frozen
class WeightSpec:
    """One tensor of a transfer, known before its values arrive.

    :ivar name: the checkpoint name (as in a ``transformers`` model's ``state_dict()``).
    :ivar shape: the full, unsharded shape.
    :ivar dtype: the dtype it travels in.
    """

    name: str
    shape: tuple[int, ...] = attrs.field(converter=_shape)
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        count = 1
        for size in self.shape:
            count *= size
        return count * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.name!r} ({_dtype_name(self.dtype)} {self.shape})"


def weight_specs(state_dict: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> tuple[WeightSpec, ...]:
    """The specs of ``state_dict``'s tensors, in its order: what inference ranks are told to expect.

    :raises loader.UnsupportedError: a name that is not a string, a value that is not a tensor, a name twice.
    """
    pairs = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
    specs: dict[str, WeightSpec] = {}
    for name, value in pairs:
        if not isinstance(name, str):
            raise UnsupportedError(f"weight names are strings; found {name!r}")
        if not isinstance(value, torch.Tensor):
            raise UnsupportedError(f"the value given for {name!r} is a {type(value).__name__}, not a torch.Tensor")
        if name in specs:
            raise UnsupportedError(f"{name!r} is given twice")
        specs[name] = WeightSpec(name, _shape(value.shape), value.dtype)
    return tuple(specs.values())


def check_specs(specs: object) -> tuple[WeightSpec, ...]:
    """``specs`` as a tuple of :class:`WeightSpec`, each name once, or an error naming what is wrong."""
    if isinstance(specs, (str, bytes, Mapping)) or not isinstance(specs, Iterable):
        raise UnsupportedError(f"specs is a sequence of loader.WeightSpec (loader.weight_specs(state_dict) "
                               f"builds it); found a {type(specs).__name__}")
    checked: dict[str, WeightSpec] = {}
    for spec in specs:
        if not isinstance(spec, WeightSpec):
            raise UnsupportedError(f"specs holds a {type(spec).__name__}, not a loader.WeightSpec")
        if spec.name in checked:
            raise UnsupportedError(f"specs list {spec.name!r} twice")
        checked[spec.name] = spec
    return tuple(checked.values())


def check_bucket_bytes(bucket_bytes: object) -> int:
    """``bucket_bytes`` when it is a whole number of bytes, at least 1."""
    if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes < 1:
        raise UnsupportedError(f"bucket_bytes must be a whole number of bytes, at least 1; found {bucket_bytes!r}")
    return bucket_bytes


@attrs.frozen
class Bucket:
    """One buffer of a transfer: its size in bytes and each tensor's byte offset in it."""

    size: int
    entries: tuple[tuple[WeightSpec, int], ...]


def plan_buckets(specs: Sequence[WeightSpec], bucket_bytes: int) -> list[Bucket]:
    """Pack ``specs``, in order, into buckets of at most ``bucket_bytes`` (a larger tensor gets a bucket alone)."""
    buckets: list[Bucket] = []
    entries: list[tuple[WeightSpec, int]] = []
    size = 0
    for spec in specs:
        start = -(-size // ALIGNMENT) * ALIGNMENT
        if entries and start + spec.nbytes > bucket_bytes:
            buckets.append(Bucket(size, tuple(entries)))
            entries, start = [], 0
        entries.append((spec, start))
        size = start + spec.nbytes
    if entries:
        buckets.append(Bucket(size, tuple(entries)))
    return buckets


def pack(bucket: Bucket, tensors: Mapping[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    """One bucket's tensors as bytes in one buffer, each at its offset (the padding between is left unset)."""
    buffer = torch.empty(bucket.size, dtype=torch.uint8, device=device)
    for spec, offset in bucket.entries:
        values = tensors[spec.name].detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[offset:offset + spec.nbytes].copy_(values)
    return buffer


def unpack(bucket: Bucket, buffer: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of a received bucket, a view into ``buffer`` (nothing copied)."""
    for spec, offset in bucket.entries:
        yield spec.name, buffer[offset:offset + spec.nbytes].view(spec.dtype).view(spec.shape)


@attrs.frozen
class Header:
    """What the sender announces in step 1: its bucket size and tensors, or why it cannot send."""

    bucket_bytes: int
    specs: tuple[WeightSpec, ...]
    error: str | None = None

    def to_wire(self) -> tuple[int, list[tuple[str, tuple[int, ...], str]], str | None]:
        """Plain values only (``torch.dtype`` does not pickle on every torch build)."""
        return self.bucket_bytes, [(s.name, s.shape, _dtype_name(s.dtype)) for s in self.specs], self.error

    @classmethod
    def from_wire(cls, wire: Any, src: int) -> Header:
        try:
            bucket_bytes, specs, error = wire
            return cls(int(bucket_bytes), tuple(WeightSpec(str(n), _shape(shape), _dtype(dt))
                                                for n, shape, dt in specs), error)
        except (TypeError, ValueError, AttributeError) as exc:
            raise ConfigError(f"rank {src} sent no weights header (is it running loader.send_weights?): "
                              f"{exc}") from exc


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def _as_sent(spec: WeightSpec) -> str:
    return f"{_dtype_name(spec.dtype)} {spec.shape}"


def disagreement(expected: Sequence[WeightSpec], header: Header, bucket_bytes: int, src: int) -> ConfigError | None:
    """Why ``header`` is not what a receiver was told to expect (``expected``, ``bucket_bytes``), or ``None``.

    The order may differ (the layout follows the header); the names, shapes, dtypes and bucket size may not.
    """
    if header.bucket_bytes != bucket_bytes:
        return ConfigError(f"rank {src} sends buckets of {header.bucket_bytes} bytes but this rank was given "
                           f"bucket_bytes={bucket_bytes}; give the sender and the receivers the same bucket size")
    mine = {spec.name: spec for spec in expected}
    theirs = {spec.name: spec for spec in header.specs}
    problems = []
    for name, spec in theirs.items():
        if name not in mine:
            problems.append(f"{spec} arrives but is not in the specs")
        elif mine[name] != spec:
            problems.append(f"{name!r} arrives as {_as_sent(spec)} where the specs say {_as_sent(mine[name])}")
    problems += [f"{spec} is in the specs but does not arrive" for name, spec in mine.items() if name not in theirs]
    if not problems:
        return None
    more = f"; ... ({len(problems)} differences in all)" if len(problems) > 5 else ""
    return ConfigError(f"the specs disagree with what rank {src} sends: {'; '.join(problems[:5])}{more}")


def group_members(group: dist.ProcessGroup | None, caller: str) -> list[int]:
    """The global ranks of ``group`` (torch's default group for ``None``); this process must be one of them."""
    if not (dist.is_available() and dist.is_initialized()):
        raise ConfigError(f"{caller} needs torch.distributed initialized (torchrun, then init_process_group)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise UnsupportedError(f"{caller}: group is a torch.distributed process group or None, found a "
                               f"{type(group).__name__}")
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise ConfigError(f"{caller}: this process (rank {dist.get_rank()}) is not in the group given")
    return [int(rank) for rank in dist.get_process_group_ranks(group or dist.group.WORLD)]


def transfer_device(group: dist.ProcessGroup | None) -> torch.device:
    """Where bucket buffers live: the current CUDA device for an NCCL group, the CPU otherwise (gloo)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def exchange_errors(error: str | None, group: dist.ProcessGroup | None, members: list[int]) -> dict[int, str]:
    """Every process's error (or ``None``) to every process; returns the errors by global rank."""
    gathered: list[str | None] = [None] * len(members)
    dist.all_gather_object(gathered, error, group=group)
    return {rank: message for rank, message in zip(members, gathered, strict=True) if message is not None}


def describe_errors(errors: dict[int, str]) -> str:
    return "; ".join(f"rank {rank}: {message}" for rank, message in sorted(errors.items()))


def error_text(exc: LoadError) -> str:
    return f"{type(exc).__name__}: {exc}"
