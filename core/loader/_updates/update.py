"""``update_weights``: new tensors into a loaded model, in place, through the model's own weight loaders.

The same weight loaders as a load (fused parts, TP narrowing, tied weights,
dtype conversion, quantize-on-load) write into each parameter's existing
storage; the quantize methods of the layers written are asked first whether
they can take new tensors (:meth:`~loader.layers.QuantizeMethodBase.weight_update_refusal`)
and run their post-processing again afterwards. A mapping of tensors is
checked whole before the first write (a probe pass, :mod:`.update_tensor`),
so a bad one changes nothing; a one-pass iterator is checked tensor by tensor
as it is written, and an error says how many were written before it. The
model's weights version (:func:`weights_version`) goes up by one on success
only. Updates of one model run one at a time (a lock per model).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import attrs
import torch
from torch import nn

from .._mapped_parameters import writes_in_place
from ..errors import LoadError, UnsupportedError
from ..weights import CheckpointTensor
from .driving import CountingStream, drive
from .tracking import (
    WriteTracker,
    check_storage_kept,
    check_written_layers,
    reprocess,
    storage_addresses,
    tracked_writes,
)
from .update_tensor import as_update_stream

__all__ = ["UpdateReport", "apply_stream", "bump_version", "exclusive_update", "probe", "update_weights",
           "weights_version"]

_VERSION = "_loader_weights_version"
_LOCK = "_loader_update_lock"
_OWNER = "_loader_update_thread"
_locks_guard = threading.Lock()


@attrs.frozen
class UpdateReport:
    """What an update wrote.

    :ivar version: the model's weights version after the update (one more than before).
    :ivar tensors: the tensors written.
    :ivar parameters: the model's parameters written to (their names), sorted.
    :ivar skipped: names the model has no parameter for, set aside (``strict=False`` only).
    :ivar reprocessed: the quantized layers whose post-processing ran again.
    :ivar bytes: the bytes of the tensors written, as given.
    :ivar seconds: how long the update took.
    """

    version: int
    tensors: int
    parameters: tuple[str, ...]
    skipped: tuple[str, ...]
    reprocessed: tuple[str, ...]
    bytes: int
    seconds: float


def weights_version(model: nn.Module) -> int:
    """How many updates ``model``'s weights have had since it was loaded (0 for a fresh load)."""
    version = model.__dict__.get(_VERSION, 0)
    return version if isinstance(version, int) else 0


def bump_version(model: nn.Module) -> int:
    """Count one more successful update of ``model``; return its new version."""
    version = weights_version(model) + 1
    model.__dict__[_VERSION] = version
    return version


@contextmanager
def exclusive_update(model: nn.Module) -> Iterator[None]:
    """Hold ``model``'s update lock: another thread's update waits; the same thread's is refused by name."""
    if not isinstance(model, nn.Module):
        raise UnsupportedError(f"expected a model returned by loader.load_model, found a {type(model).__name__}")
    with _locks_guard:
        lock = model.__dict__.setdefault(_LOCK, threading.Lock())
    if model.__dict__.get(_OWNER) == threading.get_ident():
        raise UnsupportedError(f"{type(model).__name__} is already being updated in this thread (an update was "
                               "started from inside another one's weights); updates of one model run one at a time")
    with lock:
        model.__dict__[_OWNER] = threading.get_ident()
        try:
            yield
        finally:
            model.__dict__[_OWNER] = None


def _checkable(weights: object) -> Mapping[str, torch.Tensor] | None:
    """``weights`` when it can be checked whole before any write: a mapping of torch tensors."""
    if isinstance(weights, Mapping) and all(isinstance(value, torch.Tensor) for value in weights.values()):
        return weights
    return None


def _with_note(exc: LoadError, note: str) -> LoadError:
    """``exc`` again, of the same class, with ``note`` after its message."""
    try:
        return type(exc)(f"{exc}; {note}")
    except TypeError:
        return LoadError(f"{exc}; {note}")


def probe(model: nn.Module, weights: Mapping[str, torch.Tensor], tracker: WriteTracker, strict: bool,
           skipped: dict[str, None]) -> None:
    """Run every tensor of ``weights`` through the model as a probe: all checks, no write."""
    try:
        drive(model, CountingStream(as_update_stream(weights.items(), probe=True)), strict=strict, skipped=skipped)
        check_written_layers(tracker)
    except LoadError as exc:
        raise _with_note(exc, "nothing was written (the update was checked whole first)") from exc
    finally:
        tracker.forget()


def apply_stream(model: nn.Module, pairs: Iterator[tuple[str, CheckpointTensor]], tracker: WriteTracker, *,
                 strict: bool, skipped: dict[str, None], complete: bool = False) -> CountingStream:
    """Write ``pairs`` into ``model``, post-process the quantized layers written, and return the count.

    A failure part-way says how many tensors were written before it; the layers written are post-processed
    all the same, so what was written is in its final layout (a layer that cannot be converted from what it was
    given, a packed layer missing part of its tensor set, keeps its weights as they were).
    """
    stream = CountingStream(pairs)
    try:
        drive(model, stream, strict=strict, skipped=skipped, complete=complete)
        check_written_layers(tracker)
    except LoadError as exc:
        reprocess(tracker, after_error=True)
        raise _with_note(exc, f"the update stopped there: {stream.finished} tensor(s) before it "
                              f"were written, and the weights version stays {weights_version(model)}") from exc
    return stream


def update_weights(model: nn.Module, weights: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                   strict: bool = True) -> UpdateReport:
    """Write new weights into a loaded ``model`` in place; every parameter keeps its storage.

    :param model: a model returned by :func:`loader.load_model` (under ``torchrun``, this rank's shard).
    :param weights: ``(name, tensor)`` pairs under the checkpoint's names, full (unsharded) tensors, any float
        dtype: a mapping (a ``transformers`` model's ``state_dict()``) or an iterator. Some of the model's
        tensors are enough (a partial update).
    :param strict: refuse a name the model has no parameter for; with ``False`` it is set aside and listed in
        the report.
    :returns: what was written (:class:`UpdateReport`); the model's :func:`weights_version` is one more.
    :raises loader.LoadError: a name, shape or dtype that cannot land, or a layer whose quantize method cannot
        take new tensors, by name. A mapping is checked whole first and nothing is written; an iterator stops at
        the bad tensor and the error says how many were written. Either way the version is unchanged.
    """
    if not isinstance(strict, bool):
        raise UnsupportedError(f"strict must be True or False, found {strict!r}")
    start = time.perf_counter()
    with exclusive_update(model):
        checkable = _checkable(weights)
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        before = storage_addresses(model)
        skipped: dict[str, None] = {}
        names = list(checkable) if checkable is not None else None
        with tracked_writes(model, names) as tracker, torch.no_grad(), writes_in_place():
            if checkable is not None:
                probe(model, checkable, tracker, strict, skipped)
                pairs = [(name, value) for name, value in checkable.items() if name not in skipped]
            stream = apply_stream(model, as_update_stream(iter(pairs)), tracker, strict=strict, skipped=skipped)
            reprocessed = reprocess(tracker)
        check_storage_kept(model, before)
        version = bump_version(model)
        return UpdateReport(version=version, tensors=stream.finished, parameters=tracker.touched_names(),
                            skipped=tuple(skipped), reprocessed=reprocessed, bytes=stream.bytes,
                            seconds=time.perf_counter() - start)
