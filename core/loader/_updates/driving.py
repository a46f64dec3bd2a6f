"""Running a model's own ``load_weights`` over an update's tensors, in one pass or as a probe first.

A load's ``load_weights`` ends by checking that every fused parameter got all
its parts; an update may give some parts only (a partial update), so that
check, raised once the stream is used up, is not an error here. A name the
model has no parameter for stops ``load_weights``; with ``strict=False`` it is
set aside and ``load_weights`` is called again on the rest of the same stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..errors import LoadError, MissingWeightsError, PluginError, UnexpectedWeightError
from .tracking import refusing_layer
from .update_tensor import ProbeReached

if TYPE_CHECKING:
    from torch import nn

    from ..weights import CheckpointTensor

__all__ = ["CountingStream", "drive"]


class CountingStream:
    """The update's tensors as ``load_weights`` takes them, counting those it has finished with.

    A plain iterator (not a generator): ``load_weights`` stopping on an error leaves it where it was, so a
    second call continues with the next tensor.
    """

    def __init__(self, pairs: Iterator[tuple[str, CheckpointTensor]]) -> None:
        self._pairs = pairs
        self.current: str | None = None
        self.finished = 0
        self.bytes = 0
        self.exhausted = False
        self._pending_bytes = 0

    def __iter__(self) -> CountingStream:
        return self

    def __next__(self) -> tuple[str, CheckpointTensor]:
        self.finish_current()
        try:
            name, tensor = next(self._pairs)
        except StopIteration:
            self.exhausted = True
            raise
        self.current, self._pending_bytes = name, tensor.nbytes
        return name, tensor

    def finish_current(self) -> None:
        """The tensor in hand was written (``load_weights`` asked for the next one, or returned)."""
        if self.current is not None:
            self.finished += 1
            self.bytes += self._pending_bytes
            self.current = None

    def set_aside(self) -> str:
        """The tensor in hand was not written (its name is unknown): drop it from the count; return its name."""
        assert self.current is not None
        name, self.current = self.current, None
        return name


def drive(model: nn.Module, stream: CountingStream, *, strict: bool, skipped: dict[str, None],
          complete: bool = False) -> None:
    """``model.load_weights(stream)`` until the stream is used up; names set aside are added to ``skipped``.

    With ``complete`` (a reload), a fused parameter given only some of its parts is an error, as in a load.

    :raises UnexpectedWeightError: with ``strict``, a name the model has no parameter for.
    :raises PluginError: a bug in the model's ``load_weights`` (anything not a :class:`~loader.errors.LoadError`).
    """
    while True:
        try:
            model.load_weights(stream)  # type: ignore[operator]
        except MissingWeightsError:
            if complete or not stream.exhausted:
                raise
        except UnexpectedWeightError as exc:
            refused = refusing_layer(model, stream.current) if stream.current is not None else None
            if refused is not None:
                raise refused from exc
            if strict or stream.current is None:
                raise
            skipped[stream.set_aside()] = None
            continue
        except ProbeReached:  # load_weights read a probe itself: it got as far as a write
            stream.finish_current()
            continue
        except LoadError:
            raise
        except Exception as exc:
            raise PluginError(f"model class {type(model).__name__} failed in load_weights during an update: "
                              f"{type(exc).__name__}: {exc}") from exc
        stream.finish_current()
        if stream.exhausted:
            return
