"""Which kernel a layer runs with, why, and from what: one record, and the one chooser that makes it.

A quantize method states what a layer could run with — its kernels in order
of preference, each with the reason it cannot take this layer (``None`` when
it can; the core's kernels say why with :func:`~loader.kernels.int4_unsupported_reason`,
:func:`~loader.kernels.int8_grouped_unsupported_reason` and
:func:`~loader.kernels.int8_unsupported_reason`) — and :func:`choose_kernel`
picks the first that can, else the method's fallback with the preferred
kernel's reason. The :class:`KernelChoice` it returns is what the method
records per layer for the load report and returns from
:meth:`~loader.layers.QuantizeMethodBase.layer_plan` (``loader inspect --layers``):
the CLI prints both through :meth:`KernelChoice.record`.

Imports no torch: a plugin's light modules (its config) may name it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from .token_plan import TokenPlan

__all__ = ["KernelChoice", "KernelOption", "choose_kernel"]


@attrs.frozen
class KernelChoice:
    """One layer's kernel, why it is not the preferred one, and what it runs from.

    :ivar kernel: the kernel's name as the method's reports give it (``int4pack``, ``int4``, ``dequantized``,
        ``dense``; a fused layer split between kernels joins them: ``int4+dequantized``).
    :ivar reason: why the preferred kernel does not take the layer (``None`` when it runs).
    :ivar types: what the layer is stored as, per part (a GGUF layer's block types); empty when the method does
        not report it.
    :ivar packed_bytes: the bytes the kernel keeps for the layer (reported with :attr:`types`).
    :ivar dtype: what a dequantized layer holds (reported with :attr:`types`; ``None`` for a packed one).
    :ivar paths: which path (:mod:`~loader.kernels.token_plan`) a call runs, per activation dtype and token
        bucket (empty when the method plans none); recorded as ``by_tokens``.
    """

    kernel: str
    reason: str | None = None
    types: tuple[str, ...] = ()
    packed_bytes: int = 0
    dtype: str | None = None
    paths: tuple[TokenPlan, ...] = ()

    def record(self) -> dict[str, Any]:
        """The load report's (and ``loader inspect --layers``') record: ``kernel`` and ``reason``; with
        :attr:`types` also ``types``, ``packed_bytes`` and ``dtype``; with :attr:`paths` also ``by_tokens``
        (``{dtype: {"1": path, "2-16": path, ...}}``) and ``paths_from`` (``measured`` or ``static``)."""
        record: dict[str, Any] = {"kernel": self.kernel, "reason": self.reason}
        if self.types:
            record = {"kernel": self.kernel, "types": self.types, "packed_bytes": self.packed_bytes,
                      "reason": self.reason, "dtype": self.dtype}
        if self.paths:
            record["by_tokens"] = {plan.dtype: plan.record() for plan in self.paths}
            record["paths_from"] = "+".join(dict.fromkeys(plan.source for plan in self.paths))
        return record


@attrs.frozen
class KernelOption:
    """A kernel a layer could run with, and why it cannot take this layer (``None``: it can)."""

    kernel: str
    reason: str | None = None


def choose_kernel(options: Iterable[KernelOption], fallback: str, *, types: Iterable[str] = (),
                  dtype: str | None = None) -> KernelChoice:
    """The first of ``options`` (in order of preference) that can take the layer; else ``fallback`` with the
    reason of the first, the preferred one (``fallback`` alone when there is no option).

    :param types: what the layer is stored as (:attr:`KernelChoice.types`).
    :param dtype: what the layer holds should it fall back (:attr:`KernelChoice.dtype`).
    """
    preferred: str | None = None
    for index, option in enumerate(options):
        if option.reason is None:
            return KernelChoice(option.kernel, None, tuple(types))
        if index == 0:
            preferred = option.reason
    return KernelChoice(fallback, preferred, tuple(types), dtype=dtype)
