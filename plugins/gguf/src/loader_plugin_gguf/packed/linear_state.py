"""What a packed GGUF linear layer keeps between ``create_weights``, loading and ``apply``: its size, the parts
handed to it, and, once processed, its choice, its packed weight and its segments."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import torch

from loader.kernels import Int4CpuWeight, Int8GroupedWeight, KernelChoice, TokenPlan

if TYPE_CHECKING:
    from loader.layers import NarrowedPart

__all__ = ["GGUFLayerState", "LayerSegment", "RankSplit"]


@attrs.frozen
class RankSplit:
    """A row-parallel layer at tp > 1: its part arrives with every input column, and this rank's share.

    :ivar rank: this rank.
    :ivar size: the tensor parallel size.
    """

    rank: int
    size: int


@attrs.frozen(eq=False)
class LayerSegment:
    """Output rows ``[start, start + rows)`` of a fused layer computed by one kernel.

    :ivar kernel: ``int4``, ``int4x2`` or ``dequantized``.
    :ivar weight: an :class:`~loader.kernels.Int4CpuWeight` (``int4``), an
        :class:`~loader.kernels.Int8GroupedWeight` (``int4x2``) or the dense weight ``[rows, cols]``.
    :ivar plans: a packed segment's path per activation dtype and token count, as a whole layer's
        (:func:`loader.kernels.plan_weight_paths`); empty for a dense one.
    """

    start: int
    rows: int
    kernel: str
    weight: Int4CpuWeight | Int8GroupedWeight | torch.Tensor
    plans: tuple[TokenPlan, ...] = ()


@attrs.define
class GGUFLayerState:
    """One layer's size and the narrowed parts handed to it, until they are packed or dequantized.

    ``rows`` x ``cols`` is the layer's own per-rank shape. A row-parallel layer at tp > 1 (``split``) is handed
    its whole weight and keeps either this rank's output rows over every input column (``row_window``, packed
    or dequantized; the input gathered in :meth:`~.linear_method.GGUFLinearMethod.apply`) or, as every other
    method, its input columns (when its rows do not divide, or on a device).
    """

    prefix: str
    rows: int
    cols: int
    params_dtype: torch.dtype
    parts: list[NarrowedPart] = attrs.field(factory=list)
    choice: KernelChoice | None = None
    split: RankSplit | None = None
    row_window: tuple[int, int] | None = None
    """``(first row, rows)`` this rank computes over the gathered input; ``None``: the layer's own split."""
    int4: Int4CpuWeight | None = None
    """The packed weight over the layer's current buffers, rebuilt when a buffer is replaced (``module.to``)."""
    plans: tuple[TokenPlan, ...] = ()
    """A packed layer's path per activation dtype and token count (:func:`loader.kernels.plan_weight_paths`)."""
    segments: list[LayerSegment] = attrs.field(factory=list)
    """A fused layer whose parts need different kernels: one per run of parts on one kernel (else empty)."""
