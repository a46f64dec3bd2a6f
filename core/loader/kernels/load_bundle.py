"""One load's packed-weights bundle: made by the first layer that asks, written once every layer succeeded.

Why here: every quantize method that keeps what it packed between loads (the Marlin plugin's GPTQ, AWQ and
compressed-tensors layers, the GGUF plugin's blocks) needs the same lifecycle around a
:class:`~loader.kernels.PackedBundle`. The bundle is made once per load, by whichever worker thread
post-processes a layer first (under a lock, in the load's session: a bundle is per tensor-parallel rank and
size); it is written by :meth:`LoadBundle.finish` only after every layer succeeded, so a failed load writes
nothing; then it is let go, because it holds a lock and the file's map and ``torch.save(model)`` pickles the
quantization configs that hold a :class:`LoadBundle`. Its :meth:`~loader.kernels.PackedBundle.describe` record
is kept for the load report.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs

from .bundle import PackedBundle

__all__ = ["LoadBundle"]

_OPEN_LOCK = threading.Lock()
"""Guards making a load's bundle; module-wide, so a :class:`LoadBundle` holds no lock and pickles."""


@attrs.define(eq=False)
class LoadBundle:
    """One load's use of its :class:`~loader.kernels.PackedBundle`: opened on first use, finished once.

    :param opener: makes the load's bundle, or ``None`` when this load keeps none (another device, say); called
        under a lock until it returns one. A module-level function or a ``functools.partial`` of one, so the
        configs holding this pickle.
    """

    opener: Callable[[], PackedBundle | None]
    bundle: PackedBundle | None = attrs.field(default=None, init=False)
    """The open bundle, during the load only."""
    report: dict[str, Any] | None = attrs.field(default=None, init=False)
    """What :meth:`finish` kept of the bundle for the load report."""

    def open(self) -> PackedBundle | None:
        """The load's bundle (made on the first call), ``None`` once finished or when the opener makes none."""
        if self.report is not None:
            return None
        with _OPEN_LOCK:
            if self.bundle is None:
                self.bundle = self.opener()
            return self.bundle

    def finish(self) -> None:
        """After every layer succeeded: write the bundle when this load packed a unit it did not find, keep its
        record and let it go."""
        bundle = self.bundle
        if bundle is not None:
            bundle.finish()
            self.report, self.bundle = bundle.describe(), None

    def describe(self) -> dict[str, Any] | None:
        """The bundle's record for the load report (``None`` when no layer opened it)."""
        return self.bundle.describe() if self.bundle is not None else self.report
