"""What a packed GGUF linear layer keeps, decided from its parts' block types, windows and its shape alone.

Every reason is known before a block is read: the load decides here after its parts are in, and a plan
(``loader inspect --layers``) decides here from the header, so a plan is what the load records. Each part
states the kernel its block type runs on (``int4`` for Q4 blocks, ``int4x2`` for Q8_0) or why it cannot stay
packed, the layer's shape is checked against that kernel, and the core's chooser
(:func:`loader.kernels.choose_kernel`) makes the :class:`~loader.kernels.KernelChoice`; what no kernel takes is
``dequantized``. A fused layer whose parts need different kernels is split into segments, each run of parts on
its own kernel.
"""

from __future__ import annotations

import attrs
import torch

from loader.errors import CheckpointFormatError
from loader.kernels import (
    KernelChoice,
    KernelOption,
    choose_kernel,
    int4_unsupported_reason,
    int8_grouped_unsupported_reason,
)
from loader.layers import NarrowedPart
from loader.weights import CheckpointTensor

from .linear_state import GGUFLayerState
from .options import FALLBACK
from .q4_blocks import GROUP_SIZE, kernel_for, packing_reason

__all__ = ["FLOAT_TYPE_NAMES", "KERNEL_ORDER", "Decision", "PlannedSegment", "decide", "dense_dtype",
           "shape_reason"]

KERNEL_ORDER = ("int4", "int4x2", FALLBACK)
"""How a segmented layer's kernel names its segments' kernels (``int4+dequantized``)."""
FLOAT_TYPE_NAMES = ("F32", "F16", "BF16", "F64")


@attrs.frozen
class PlannedSegment:
    """A run of consecutive parts on one kernel: its first output row, tensors (in row order), kernel and why
    it is dequantized (``None`` when packed)."""

    start: int
    rows: int
    tensors: list[CheckpointTensor]
    types: tuple[str, ...]
    kernel: str
    reason: str | None = None


@attrs.frozen
class Decision:
    """What a layer keeps: this rank's tensors (destination row, tensor) in row order, the shape, and why not packed.

    ``row_window`` is set when a row-parallel layer keeps this rank's output rows over every input column.
    """

    tensors: list[tuple[int, CheckpointTensor]]
    types: tuple[str, ...]
    shape: tuple[int, int]
    reason: str | None
    row_window: tuple[int, int] | None = None
    kernel: str = "int4"
    """``int4`` (Q4 blocks) or ``int4x2`` (Q8_0 codes as two int4 planes) when ``reason`` is ``None``;
    the segments' kernels joined by ``+`` (``int4+dequantized``) when :attr:`segments` is set."""
    segments: tuple[PlannedSegment, ...] = ()
    """A fused layer whose parts need different kernels: its runs of parts, each on its own kernel."""


def decide(state: GGUFLayerState, device: torch.device, kernel_dtype: torch.dtype) -> Decision:
    """This rank's tensors, their block types, the kept shape and why the layer cannot stay packed.

    A row-parallel layer at tp > 1 keeps this rank's output rows over every
    input column when they can be packed (each rank then computes whole rows,
    so tp > 1 adds exactly what tp=1 computes), else its input columns as
    other methods do (packed when that can be, else dequantized).
    """
    parts = sorted(state.parts, key=lambda p: p.offset)
    if sum(p.size for p in parts) != state.rows:
        raise CheckpointFormatError(f"{state.prefix}: its parts fill {sum(p.size for p in parts)} of "
                                    f"{state.rows} rows")
    types = tuple(p.narrowed.stored_type for p in parts)
    own = Decision([(p.offset, p.narrowed) for p in parts], types, (state.rows, state.cols), None)
    if state.split is not None:  # one part with every input column: this rank's columns, as other methods
        own = attrs.evolve(own, tensors=[(0, parts[0].narrowed.narrow(1, state.split.rank * state.cols,
                                                                      state.cols))])
    if device.type != "cpu":
        return attrs.evolve(own, reason=f"the packed int4 kernel runs on the CPU, not {device}")
    segments = _segments(state, own, parts, kernel_dtype) if state.split is None and len(parts) > 1 else ()
    if len(segments) == 1:  # every run dequantized after all: one dense weight, with every run's reason
        return attrs.evolve(own, reason=segments[0].reason)
    if segments:
        kernels = {segment.kernel for segment in segments}
        reasons = [segment.reason for segment in segments if segment.reason is not None]
        return attrs.evolve(own, segments=segments, reason="; ".join(reasons) or None,
                            kernel="+".join(k for k in KERNEL_ORDER if k in kernels))
    candidates = [own]
    if state.split is not None and state.rows % state.split.size == 0:  # or this rank's rows: first choice
        n = state.rows // state.split.size
        start = state.split.rank * n
        candidates.insert(0, Decision([(0, parts[0].narrowed.narrow(0, start, n))], types,
                                      (n, state.cols * state.split.size), None, (start, n)))
    reasons = []
    for candidate in candidates:
        choice = _layer_kernel(candidate, parts, kernel_dtype)
        if choice.reason is None:
            return attrs.evolve(candidate, kernel=choice.kernel)
        reasons.append(choice.reason)
    if len(candidates) == 1:
        return attrs.evolve(own, reason=reasons[0])
    # dequantized too, a row window computes what tp=1 does (no partial sums in a narrow dtype)
    return attrs.evolve(candidates[0], reason=f"this rank's rows: {reasons[0]}; its columns: {reasons[1]}")


def _part_kernels(candidate: Decision, parts: list[NarrowedPart], kernel_dtype: torch.dtype) -> list[KernelChoice]:
    """Each part's kernel (``int4``, ``int4x2``) or ``dequantized`` with the reason, from its block type."""
    kernels: list[KernelChoice] = []
    for (_, tensor), part in zip(candidate.tensors, parts, strict=True):
        found, kernel = packing_reason(tensor), kernel_for(tensor)
        if found is None and kernel == "int4x2" and kernel_dtype == torch.float32:
            found = f"ggml type {tensor.stored_type} runs as two int4 planes only in bfloat16/float16"
        if found is not None and part.shard_id is not None:
            found = f"part {part.shard_id!r}: {found}"
        kernels.append(choose_kernel([KernelOption(kernel, found)], FALLBACK))
    return kernels


def _layer_kernel(candidate: Decision, parts: list[NarrowedPart], kernel_dtype: torch.dtype) -> KernelChoice:
    """The kernel every part of ``candidate`` can run on, or why the layer is dequantized."""
    kernels = _part_kernels(candidate, parts, kernel_dtype)
    refused = next((choice for choice in kernels if choice.reason is not None), None)
    if refused is not None:
        return refused
    kernel = kernels[0].kernel
    # parts needing different kernels were split into segments first (:func:`_segments`)
    assert all(choice.kernel == kernel for choice in kernels), kernels
    return choose_kernel([KernelOption(kernel, shape_reason(kernel, *candidate.shape))], FALLBACK)


def shape_reason(kernel: str, rows: int, cols: int) -> str | None:
    """Why ``kernel`` cannot take a ``rows`` x ``cols`` weight (``None``: it can)."""
    if kernel == "int4x2":
        return int8_grouped_unsupported_reason(rows, cols)
    return int4_unsupported_reason(rows, cols, GROUP_SIZE)


def _segments(state: GGUFLayerState, own: Decision, parts: list[NarrowedPart],
              kernel_dtype: torch.dtype) -> tuple[PlannedSegment, ...]:
    """A fused layer's runs of consecutive parts on one kernel; empty when its parts share one kernel (or all
    fall back for one reason each, as one dense weight); one dequantized run when the runs that could be
    packed are refused too.

    Why: one call cannot take two kernels, and a Q4_K_M file's ``attn_v`` is
    Q6_K beside Q4_K ``q``/``k`` in about half the layers — dequantizing the
    whole fused layer for it held ``q`` and ``k`` in bfloat16 too. A run the
    kernel refuses (its rows no multiple of 16) is dequantized; adjacent
    dequantized runs are one dense weight.
    """
    kernels = _part_kernels(own, parts, kernel_dtype)
    if len({choice.kernel for choice in kernels}) < 2:
        return ()
    runs: list[list[int]] = []
    for index, choice in enumerate(kernels):
        if runs and kernels[runs[-1][0]].kernel == choice.kernel:
            runs[-1].append(index)
        else:
            runs.append([index])
    planned: list[PlannedSegment] = []
    for run in runs:
        kernel = kernels[run[0]].kernel
        rows = sum(parts[i].size for i in run)
        tensors = [own.tensors[i][1] for i in run]
        types = tuple(own.types[i] for i in run)
        reason = "; ".join(str(kernels[i].reason) for i in run) if kernel == FALLBACK else None
        if reason is None and (refused := shape_reason(kernel, rows, state.cols)) is not None:
            ids = ", ".join(repr(parts[i].shard_id) for i in run)
            kernel, reason = FALLBACK, f"part{'s' if len(run) > 1 else ''} {ids}: {refused}"
        start = planned[-1].start + planned[-1].rows if planned else 0
        if planned and kernel == FALLBACK and planned[-1].kernel == FALLBACK:
            last = planned.pop()
            start, rows = last.start, last.rows + rows
            tensors, types = last.tensors + tensors, last.types + types
            reason = f"{last.reason}; {reason}"
        planned.append(PlannedSegment(start, rows, tensors, types, kernel, reason))
    return tuple(planned)


def dense_dtype(state: GGUFLayerState, types: tuple[str, ...], configured: torch.dtype | None) -> torch.dtype:
    """What a dequantized layer holds: the ``configured`` dense dtype when every part is quantized blocks, else
    the layer's dtype (float tensors are not narrowed behind the user's back)."""
    if configured is None or any(t in FLOAT_TYPE_NAMES for t in types):
        return state.params_dtype
    return configured
