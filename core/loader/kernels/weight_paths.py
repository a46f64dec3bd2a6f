"""Run a kept quantized weight along one path (:mod:`~loader.kernels.token_plan`), and plan which path per call.

Any weight with ``matmul`` (its packed kernel), ``dequantize(dtype)``, ``rows(n)`` and ``kernel_dtype`` — the
core's :class:`~loader.kernels.Int4CpuWeight`, :class:`~loader.kernels.Int8GroupedWeight`,
:class:`~loader.kernels.Int8CpuWeight`, and a plugin's own kernels with the same four — runs every path:
:func:`run_path` for one, :func:`run_planned` for the plan's path of a call's dtype and token count, and
:func:`plan_weight_paths` times them (:mod:`~loader.kernels.kernel_timing`) to make that plan.

Accuracy of each path against exact float32 arithmetic on the checkpoint's weight (``w = (q - z) * s``):

- ``dense`` / ``dequantize``: the weight as kept (scales in the kernel dtype: exact in float32 under the
  exact option, else the scales rounded to bfloat16, a relative error up to 2^-9 per weight), one matmul in
  the activations' dtype.
- ``packed``: the same weight; the packed kernel accumulates in float32 and rounds each output to its dtype
  (bfloat16/float16 activations only: torch's float32 packed kernels lost to dequantizing at every size).
- ``packed-bf16`` (float32 activations): the activations rounded to bfloat16 (2^-9 relative each) and each
  output rounded to bfloat16 before the cast back; logits of a whole model differ from exact float32 by about
  1 % (relative, norm-wise: :data:`PACKED_BF16_LOGITS_TOLERANCE`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import torch

from .._settings import KERNEL_DENSE_BUDGET, KERNEL_EXACT_FLOAT32, KERNEL_MEASURE
from .kernel_timing import PathCall, measured_plan
from .token_plan import DENSE, DEQUANTIZE, PACKED, PACKED_BF16, TokenPlan, static_plan

__all__ = ["DEQUANTIZE_TILE", "MEASURE_MAX_WEIGHTS", "PACKED_BF16_LOGITS_TOLERANCE", "PathWeight",
           "available_paths", "dense_budget", "dequantize_tile_rows", "exact_float32_default", "measure_rows",
           "paths_from_shapes", "plan_weight_paths", "run_path", "run_planned"]

PACKED_BF16_LOGITS_TOLERANCE = 2e-2
"""The documented bound on a float32 model's logits (norm of the difference over the norm) when its quantized
layers run ``packed-bf16`` instead of exact float32 (measured ~0.5 % on SmolLM2 W4A16)."""

MEASURE_MAX_WEIGHTS = 1 << 25
"""A layer of at most this many weights is timed whole (:func:`measure_rows`); 32 Mi covers every linear of a
1-3 B model and bounds the first load's timing of a larger one."""

DEQUANTIZE_TILE = 1 << 22
"""Weights dequantized at once by the ``dequantize`` path (output rows in tiles of this many weights), so its
transient stays ~16 MiB in float32 however wide the layer."""


class PathWeight(Protocol):
    """What a kept weight offers the paths."""

    @property
    def kernel_dtype(self) -> torch.dtype: ...

    @property
    def in_features(self) -> int: ...

    @property
    def out_features(self) -> int: ...

    def matmul(self, x: torch.Tensor) -> torch.Tensor: ...

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor: ...

    def rows(self, start: int, stop: int) -> PathWeight:
        """Output rows ``[start, stop)``; ``start`` a multiple of 64 (the int4 layout's row blocks)."""
        ...


def available_paths(weight: PathWeight, dtype: torch.dtype, *, exact: bool = False,
                    dense: bool = False) -> tuple[str, ...]:
    """The paths ``weight`` can run for activations of ``dtype``: ``packed`` when its kernel computes in that
    dtype (bfloat16, float16), ``packed-bf16`` for float32 activations over a bfloat16 kernel (not under
    ``exact``), always ``dequantize``, and ``dense`` when a dequantized copy is (or may be) kept."""
    return _available(weight.kernel_dtype, dtype, exact, dense)


def _available(kernel_dtype: torch.dtype, dtype: torch.dtype, exact: bool, dense: bool) -> tuple[str, ...]:
    # torch's float32 packed kernels were 10-50x slower than dequantizing at every size measured (and never
    # clearly faster at one token): not offered, so timing noise cannot pick them
    paths = [PACKED] if kernel_dtype == dtype and dtype != torch.float32 else []
    if dtype == torch.float32 and kernel_dtype == torch.bfloat16 and not exact:
        paths.append(PACKED_BF16)
    paths.append(DEQUANTIZE)
    if dense:
        paths.append(DENSE)
    return tuple(paths)


def paths_from_shapes(dtype: torch.dtype, kernel_dtype: torch.dtype, *, exact: bool = False) -> tuple[TokenPlan, ...]:
    """What a layer's plan will be, for ``loader inspect --layers`` (before any weight is read): the static
    rule's under ``LOADER_KERNEL_MEASURE=0``; nothing otherwise (the plan is timed at load)."""
    if KERNEL_MEASURE.read():
        return ()
    name = str(dtype).removeprefix("torch.")
    return (static_plan(name, _available(kernel_dtype, dtype, exact, False), exact),)


def exact_float32_default() -> bool:
    """Whether float32 loads keep exact float32 arithmetic when the load's options do not say
    (``LOADER_KERNEL_EXACT_FLOAT32``, default off)."""
    return KERNEL_EXACT_FLOAT32.read()


def dense_budget() -> int:
    """The bytes of dequantized copies one load may keep beside its quantized weights
    (``LOADER_KERNEL_DENSE_BUDGET``, default 0): a method keeps a layer's copy only when its plan runs ``dense``
    for some token count and the copy fits in what is left."""
    return KERNEL_DENSE_BUDGET.read()


def dequantize_tile_rows(in_features: int) -> int:
    """Output rows the ``dequantize`` path dequantizes at once (a multiple of 64: whole row blocks)."""
    return max(64, DEQUANTIZE_TILE // max(1, in_features) // 64 * 64)


def _dequantize_tiles(weight: PathWeight, x: torch.Tensor) -> torch.Tensor:
    """One matmul per tile of output rows, each dequantized just before (whole row blocks of the int4 layout)."""
    n = weight.out_features
    rows = dequantize_tile_rows(weight.in_features)
    if rows >= n or n % 64:
        return torch.nn.functional.linear(x, weight.dequantize(x.dtype))
    out = x.new_empty(*x.shape[:-1], n)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        out[..., start:stop] = torch.nn.functional.linear(x, weight.rows(start, stop).dequantize(x.dtype))
    return out


def run_path(weight: PathWeight, path: str, x: torch.Tensor, dense: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ w.T`` in ``x``'s dtype along ``path``.

    :param dense: the kept dequantized weight (``dense`` path only).
    """
    if path == PACKED:
        return weight.matmul(x).to(x.dtype)
    if path == PACKED_BF16:
        return weight.matmul(x.to(torch.bfloat16)).to(x.dtype)
    if path == DENSE:
        if dense is None:
            raise ValueError("the dense path needs the kept dequantized weight")
        return torch.nn.functional.linear(x, dense if dense.dtype == x.dtype else dense.to(x.dtype))
    if path == DEQUANTIZE:
        return _dequantize_tiles(weight, x)
    raise ValueError(f"unknown kernel path {path!r}")


def run_planned(weight: PathWeight, plans: Sequence[TokenPlan], x: torch.Tensor,
                dense: torch.Tensor | None = None) -> torch.Tensor:
    """The path ``plans`` give a call of ``x``'s dtype and token count (a dtype not planned: the static rule)."""
    name = str(x.dtype).removeprefix("torch.")
    tokens = x.numel() // max(1, x.shape[-1])
    for plan in plans:
        if plan.dtype == name:
            return run_path(weight, plan.path_for(tokens), x, dense)
    fallback = static_plan(name, available_paths(weight, x.dtype, dense=dense is not None))
    return run_path(weight, fallback.path_for(tokens), x, dense)


def measure_rows(out_features: int, in_features: int) -> int:
    """Rows a layer is timed over: all of them up to :data:`MEASURE_MAX_WEIGHTS` weights (and when they are not
    whole blocks of 64); of a larger layer, the first rows holding about that many, in whole tiles of the
    ``dequantize`` path.

    Why whole layers, not a short slice scaled: per row, a slice is not the layer. A slice whose weight fits the
    last-level cache runs the packed kernel up to 1.4x faster per row than the whole layer does (W8A16
    per-channel, 2048 x 11264, float32 at 512 tokens: 58 ms on 4096 rows, 216 ms on all 11264), and a slice
    inside one dequantized tile skips the per-tile costs of the twin; either made the chooser pick a path that
    is slower over the layer. Timing whole layers costs a few seconds per layer shape at the first load on a
    2-core machine; the timings are cached."""
    if out_features % 64 or out_features * in_features <= MEASURE_MAX_WEIGHTS:
        return out_features
    tile = dequantize_tile_rows(in_features)
    return max(tile, MEASURE_MAX_WEIGHTS // max(1, in_features) // tile * tile)


def plan_weight_paths(weight: PathWeight, key: str, dtype: torch.dtype, *, exact: bool = False,
                      dense: bool = False, extra_sources: Iterable[Path] = ()) -> TokenPlan:
    """The plan of ``weight`` for activations of ``dtype``: timed on its first rows once per layer kind
    (``key`` names the kind: family, input width, group; the rows timed are added), else cached or static."""
    available = available_paths(weight, dtype, exact=exact, dense=dense)
    rows = measure_rows(weight.out_features, weight.in_features)

    def make_paths() -> dict[str, PathCall]:
        part = weight.rows(0, rows)
        kept = part.dequantize(dtype)
        return {path: _bound(part, path, kept) for path in available_paths(part, dtype, exact=exact, dense=True)}

    return measured_plan(f"{key}:K={weight.in_features}:N={rows}", dtype, available, make_paths,
                         weight.in_features, exact=exact, extra_sources=extra_sources)


def _bound(weight: PathWeight, path: str, dense: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: run_path(weight, path, x, dense)
