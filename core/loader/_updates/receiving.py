"""``update_weights_from_distributed``: an inference rank's side of a weight transfer (protocol: :mod:`.transfer`).

The tensors arrive whole (full, unsharded) in buckets and go through the same
path as :func:`loader.update_weights`: the model's ``load_weights`` and each
parameter's weight loader, which narrows a full tensor to this rank's shard of
the tensor parallel group (:func:`loader.set_tensor_parallel_group`) before
copying it, so a rank keeps only its shard. Before anything is sent, the
specs are run through the model as a probe of ``meta`` tensors (names, shapes,
TP splits, quantize methods: every check, no memory, no write) and checked
against the sender's header; every rank learns every other's verdict, so
either all go on or all stop with a message.

A write that fails after that (rare: the probe made every check a write
makes) still receives the remaining buckets without writing them, so the
sender and the other ranks finish the transfer and learn the error by rank.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch
import torch.distributed as dist
from torch import nn

from .._mapped_parameters import writes_in_place
from ..errors import LoadError, UnsupportedError
from .tracking import WriteTracker, check_storage_kept, reprocess, storage_addresses, tracked_writes
from .transfer import (
    DEFAULT_BUCKET_BYTES,
    Bucket,
    Header,
    WeightSpec,
    check_bucket_bytes,
    check_specs,
    describe_errors,
    disagreement,
    error_text,
    exchange_errors,
    group_members,
    plan_buckets,
    transfer_device,
    unpack,
)
from .update import UpdateReport, apply_stream, bump_version, exclusive_update, probe
from .update_tensor import as_update_stream

__all__ = ["update_weights_from_distributed"]


class _Arrivals:
    """The buckets of one transfer, received one at a time as the model's ``load_weights`` asks for tensors."""

    def __init__(self, buckets: list[Bucket], src: int, group: dist.ProcessGroup | None,
                 skipped: dict[str, None]) -> None:
        self._buckets = buckets
        self._src = src
        self._group = group
        self._skipped = skipped
        self._device = transfer_device(group)
        self.received = 0

    def _receive(self) -> tuple[Bucket, torch.Tensor]:
        bucket = self._buckets[self.received]
        buffer = torch.empty(bucket.size, dtype=torch.uint8, device=self._device)
        dist.broadcast(buffer, src=self._src, group=self._group)
        self.received += 1
        return bucket, buffer

    def pairs(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Each tensor as a view into its bucket's buffer, in sending order (names set aside left out)."""
        while self.received < len(self._buckets):
            bucket, buffer = self._receive()
            yield from ((name, tensor) for name, tensor in unpack(bucket, buffer) if name not in self._skipped)
            del buffer  # this generator's hold on the bucket ends before the next one is received

    def drain(self) -> None:
        """Receive the buckets not yet received, writing nothing: the sender finishes the transfer."""
        while self.received < len(self._buckets):
            self._receive()


def _check_src(src: object, members: list[int]) -> int:
    """``src`` when it is another process of the group (the sender)."""
    if isinstance(src, bool) or not isinstance(src, int) or src not in members:
        raise UnsupportedError(f"src must be the sender's rank, one of the group's ranks {members}; found {src!r}")
    if src == dist.get_rank():
        raise UnsupportedError(f"src={src} is this process: the sender calls loader.send_weights, not "
                               "update_weights_from_distributed")
    return src


def _meta_tensors(specs: Sequence[WeightSpec]) -> dict[str, torch.Tensor]:
    return {spec.name: torch.empty(spec.shape, dtype=spec.dtype, device="meta") for spec in specs}


def _names_of(specs: object) -> list[str] | None:
    """The names ``specs`` announce, when they are well formed (else ``None``: the checks say what is wrong)."""
    if isinstance(specs, Sequence) and all(isinstance(spec, WeightSpec) for spec in specs):
        return [spec.name for spec in specs]
    return None


def _agree(model: nn.Module, specs: object, bucket_bytes: object, src: int, group: dist.ProcessGroup | None,
           members: list[int], tracker: WriteTracker, strict: bool, skipped: dict[str, None]) -> Header:
    """Steps 1 and 2 of the protocol: this rank's checks and the sender's header, then every rank's verdict."""
    own: LoadError | None = None
    size = 0
    expected: tuple[WeightSpec, ...] = ()
    try:
        size, expected = check_bucket_bytes(bucket_bytes), check_specs(specs)
        probe(model, _meta_tensors(expected), tracker, strict, skipped)
    except LoadError as exc:
        own = exc
    wire: list[object] = [None]
    dist.broadcast_object_list(wire, src=src, group=group)
    header = Header(0, ())
    try:
        header = Header.from_wire(wire[0], src)
    except LoadError as exc:
        own = own or exc
    if own is None and header.error is None:
        own = disagreement(expected, header, size, src)
    errors = exchange_errors(error_text(own) if own is not None else None, group, members)
    if own is not None:
        raise own
    if errors:
        raise LoadError(f"the weight transfer from rank {src} stopped before any tensor was sent: "
                        f"{describe_errors(errors)}")
    return header


def _finish(own: LoadError | None, src: int, group: dist.ProcessGroup | None, members: list[int]) -> None:
    """Step 4: every rank's outcome; raise this rank's error or, naming them, the others'."""
    errors = exchange_errors(error_text(own) if own is not None else None, group, members)
    if own is not None:
        raise own
    if errors:
        raise LoadError(f"the weights from rank {src} were written here but not on every rank (the tensor "
                        f"parallel model is inconsistent until the next update): {describe_errors(errors)}")


def update_weights_from_distributed(model: nn.Module, specs: Sequence[WeightSpec], *, src: int,
                                    group: dist.ProcessGroup | None = None,
                                    bucket_bytes: int = DEFAULT_BUCKET_BYTES, strict: bool = True) -> UpdateReport:
    """Receive the tensors rank ``src`` sends with :func:`loader.send_weights` and write them into ``model``.

    Every inference rank of ``group`` calls this at the same time; each keeps only its shard of each tensor.

    :param model: a model returned by :func:`loader.load_model` (this rank's shard).
    :param specs: what will arrive, each tensor's name, full shape and dtype (:func:`loader.weight_specs` of the
        trainer's state dict); checked against the model and against what the sender announces before anything
        is sent.
    :param src: the sender's global rank.
    :param group: the ``torch.distributed`` group holding the sender and every receiver (default: torch's
        default group); not the tensor parallel group, which must not hold the sender.
    :param bucket_bytes: the sender's bucket size; a receiving rank holds at most two buckets at once.
    :param strict: refuse a name the model has no parameter for; with ``False`` it is received and set aside.
    :returns: what was written (:class:`loader.UpdateReport`); the model's weights version is one more.
    :raises loader.LoadError: bad input on this rank or the sender, specs that disagree with what is sent, or a
        write that failed (here, or on another rank, by rank), by name; the version is unchanged.
    """
    members = group_members(group, "update_weights_from_distributed")
    src = _check_src(src, members)
    if not isinstance(strict, bool):
        raise UnsupportedError(f"strict must be True or False, found {strict!r}")
    start = time.perf_counter()
    with exclusive_update(model):
        before = storage_addresses(model)
        skipped: dict[str, None] = {}
        with tracked_writes(model, _names_of(specs)) as tracker, torch.no_grad(), writes_in_place():
            header = _agree(model, specs, bucket_bytes, src, group, members, tracker, strict, skipped)
            arrivals = _Arrivals(plan_buckets(header.specs, header.bucket_bytes), src, group, skipped)
            own: LoadError | None = None
            try:
                stream = apply_stream(model, as_update_stream(arrivals.pairs()), tracker, strict=strict,
                                      skipped=skipped)
                reprocessed = reprocess(tracker)
                check_storage_kept(model, before)
            except LoadError as exc:
                own = exc
                arrivals.drain()
            _finish(own, src, group, members)
        version = bump_version(model)
        return UpdateReport(version=version, tensors=stream.finished, parameters=tracker.touched_names(),
                            skipped=tuple(skipped), reprocessed=reprocessed, bytes=stream.bytes,
                            seconds=time.perf_counter() - start)
