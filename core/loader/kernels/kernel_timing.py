"""Time a quantized layer's paths on this machine once, keep the timings on disk, and plan from them.

Why: which path is fastest (:mod:`loader.kernels.token_plan`) differs between CPUs, torch builds and thread
counts by factors, not percents, so it is measured rather than assumed. A layer kind (a kernel family over a
given input width and group, and its output rows: the whole layer up to a size,
:func:`~loader.kernels.weight_paths.measure_rows`) is timed the first time a load meets it: each path at each of
:data:`~loader.kernels.token_plan.TOKEN_BUCKETS` tokens, in :data:`ROUNDS` interleaved rounds, the fastest
call kept (:func:`measure_paths`: the least disturbed by other work on a shared machine). A path far behind
(:data:`HOPELESS`) and slow whose gap is not closing is not timed at larger buckets (the float32 packed
kernel at 512 tokens would cost a second alone); one whose cost is mostly fixed per call (dequantizing the
weight every call) is kept, since that cost amortizes over large inputs. That is a few
seconds per layer kind on a 2-core machine.

The timings are kept in ``<cache root>/kernel-timings/<fingerprint>.json``, the fingerprint a digest of the
torch version, the CPU capability and model, torch's thread count and the sources of the kernels timed (this
package's and the caller's), as the compiled helpers are keyed: another machine, torch or kernel measures
again. A cache that cannot be written is warned about once and the timings are kept for the process.
A plan made from timings (measured or cached) first settles glibc's allocator thresholds
(:func:`loader._heap.settle_malloc_thresholds`): a path that allocates temporaries per call (the dequantized twin)
costs up to twice as much in a process that has not yet freed a large block, so the timings and the forwards
must see the same state. ``LOADER_KERNEL_MEASURE=0`` times nothing and plans by the static rule
(:func:`~loader.kernels.token_plan.static_plan`); the tests run that way for determinism.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import torch

from .._atomic_file import replaced_atomically
from .._cache_root import cache_root, warn_cache_not_written
from .._heap import settle_malloc_thresholds
from .._settings import KERNEL_MEASURE
from .token_plan import DENSE, DEQUANTIZE, TOKEN_BUCKETS, TokenPlan, plan_from_timings, static_plan

__all__ = ["CALL_BUDGET_S", "CATCH_UP", "HOPELESS", "HOPELESS_MIN_S", "MIN_SPAN_S", "ROUNDS", "Timings",
           "measure_paths", "measured_plan", "timings_fingerprint", "timings_path"]

ROUNDS = 7
MIN_SPAN_S = 1.0
"""Rounds continue (up to ``4 * ROUNDS``) until the timing of a layer kind spans this many seconds."""
CALL_BUDGET_S = 0.05
"""A call slower than this is timed in two rounds only."""
HOPELESS = 8.0
HOPELESS_MIN_S = 0.01
"""A path this slow and :data:`HOPELESS` times behind at two buckets in a row is not timed at larger ones,
unless it may catch up (:data:`CATCH_UP`)."""
CATCH_UP = 0.5
"""A hopeless path is still timed at larger buckets when its gap to the best quantized path shrank to this
fraction or less from one bucket to the next: a fixed per-call cost (a dequantization) amortizing over tokens.
(Extrapolating each path linearly from two small buckets was tried: a dequantization's few-millisecond noise
makes its slope, and so its 512-token estimate, 4-8x too high.)"""

Timings = dict[int, dict[str, float]]
"""Seconds per call, by token bucket, then path."""

PathCall = Callable[[torch.Tensor], torch.Tensor]
_SOURCES = ("token_plan.py", "kernel_timing.py", "int4_cpu.py", "int8_cpu.py", "int4_layout.py", "weight_paths.py")
_lock = threading.Lock()
_memory: dict[str, Timings] = {}


def _timed(call: PathCall, x: torch.Tensor) -> float:
    """Seconds of one call; calls under a millisecond are repeated and averaged (timer resolution)."""
    count, start = 0, time.perf_counter()
    while True:
        call(x)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= 1e-3 or count >= 64:
            return elapsed / count


def measure_paths(paths: Mapping[str, PathCall], in_features: int, dtype: torch.dtype,
                  buckets: Sequence[int] = TOKEN_BUCKETS) -> Timings:
    """Seconds per call of each path at each bucket's token count, on random activations of ``dtype``.

    :data:`ROUNDS` rounds over every (bucket, path) — more, up to four times as many, until :data:`MIN_SPAN_S`
    has passed — the fastest call of each kept: a burst of other work slows the calls of one moment, and the
    minimum over rounds spread over the whole span finds the quiet moments. A call over :data:`CALL_BUDGET_S`
    is timed twice only. In the first round a path :data:`HOPELESS` times behind the best and over
    :data:`HOPELESS_MIN_S` at the two buckets before is not timed at larger ones, unless its gap to the best is
    closing or it is the dequantized twin (:func:`_pruned`).
    """
    generator = torch.Generator().manual_seed(0)
    inputs = {bucket: torch.randn(bucket, in_features, generator=generator).to(dtype) for bucket in buckets}
    timings: Timings = {bucket: {} for bucket in buckets}
    samples: dict[tuple[int, str], int] = {}
    live = {bucket: dict(paths) for bucket in buckets}
    began, round_index = time.perf_counter(), 0
    with torch.inference_mode():
        while round_index < ROUNDS or (time.perf_counter() - began < MIN_SPAN_S and round_index < 4 * ROUNDS):
            for index, bucket in enumerate(buckets):
                if round_index == 0 and index >= 2:
                    for name in _pruned(timings, buckets[index - 2], buckets[index - 1]):
                        for later in buckets[index:]:
                            live[later].pop(name, None)
                for name, call in list(live[bucket].items()):
                    if round_index == 0:
                        call(inputs[bucket])  # warm-up: first-touch allocations, lazily built kernels
                    seconds = _timed(call, inputs[bucket])
                    timings[bucket][name] = min(seconds, timings[bucket].get(name, seconds))
                    samples[bucket, name] = samples.get((bucket, name), 0) + 1
                    if seconds > CALL_BUDGET_S and samples[bucket, name] >= 2:
                        del live[bucket][name]
            round_index += 1
    return timings


def _hopeless(measured: Mapping[str, float]) -> set[str]:
    if not measured:
        return set()
    best = min(measured.values())
    return {name for name, seconds in measured.items() if seconds > HOPELESS * best and seconds > HOPELESS_MIN_S}


def _pruned(timings: Timings, first: int, second: int) -> set[str]:
    """The paths hopeless at buckets ``first`` and ``second`` whose gap to the best quantized path (any but
    :data:`~loader.kernels.token_plan.DENSE`, the kept weight, which a fixed cost never catches) does not shrink
    to :data:`CATCH_UP` of what it was: a per-token cost as the best's (float32 packed) only loses more with
    tokens, a fixed per-call cost falls behind less and less and is kept. The dequantized twin is never pruned:
    every default is judged against it, its cost is bounded (a dequantization and the dense matmul), and a
    single noisy first-round call must not drop it where it wins."""

    def gap(bucket: int, name: str) -> float:
        measured = timings[bucket]
        quantized = [seconds for path, seconds in measured.items() if path != DENSE] or list(measured.values())
        return measured[name] / min(quantized)

    candidates = (_hopeless(timings[first]) & _hopeless(timings[second])) - {DEQUANTIZE}
    return {name for name in candidates if gap(second, name) > CATCH_UP * gap(first, name)}


@functools.cache
def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def timings_fingerprint(extra_sources: Iterable[Path] = ()) -> str:
    """The digest timings are kept under: torch, CPU, threads and the kernels' sources (see the module doc)."""
    digest = hashlib.sha256()
    here = Path(__file__).resolve().parent
    for path in [here / name for name in _SOURCES] + sorted(Path(p) for p in extra_sources):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    for part in (torch.__version__, torch.backends.cpu.get_cpu_capability(), _cpu_model(),
                 str(torch.get_num_threads())):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:24]


def timings_path(fingerprint: str) -> Path:
    """``<cache root>/kernel-timings/<fingerprint>.json``."""
    return cache_root() / "kernel-timings" / f"{fingerprint}.json"


def _read(path: Path) -> dict[str, Timings]:
    try:
        raw = json.loads(path.read_text())
        return {key: {int(b): {p: float(s) for p, s in paths.items()} for b, paths in table.items()}
                for key, table in raw.items()}
    except (OSError, ValueError, AttributeError, TypeError):
        return {}  # missing or damaged: measured again and rewritten


def _store(path: Path, key: str, timings: Timings) -> None:
    table = _read(path)
    table[key] = timings
    try:
        with replaced_atomically(path, mode="w", prefix="timings-") as handle:
            json.dump({k: {str(b): v for b, v in t.items()} for k, t in table.items()}, handle, sort_keys=True)
    except OSError as error:
        warn_cache_not_written(path.parent, error)


def cached_timings(key: str, measure: Callable[[], Timings], extra_sources: Iterable[Path] = ()) -> Timings:
    """The timings of layer kind ``key``: from this process, else the disk cache, else ``measure()`` (stored)."""
    path = timings_path(timings_fingerprint(extra_sources))
    full_key = f"{path.stem}:{key}"
    with _lock:
        if full_key in _memory:
            return _memory[full_key]
        found = _read(path).get(key)
        if found is None:
            found = measure()
            _store(path, key, found)
        _memory[full_key] = found
        return found


def measured_plan(key: str, dtype: torch.dtype, available: Sequence[str],
                  make_paths: Callable[[], Mapping[str, PathCall]], in_features: int, *, exact: bool = False,
                  extra_sources: Iterable[Path] = ()) -> TokenPlan:
    """The plan of a layer of kind ``key`` for activations of ``dtype``: the fastest available path per bucket
    by this machine's timings, or the static rule under ``LOADER_KERNEL_MEASURE=0``.

    :param make_paths: the calls to time (the layer's weight, or its first rows:
        :func:`~loader.kernels.weight_paths.measure_rows`),
        made only when the timings are not cached.
    """
    name = str(dtype).removeprefix("torch.")
    if not KERNEL_MEASURE.read():
        return static_plan(name, available, exact)
    settle_malloc_thresholds()  # measured and later run in the same allocator state: loader._heap
    timings = cached_timings(f"{key}:{name}", lambda: measure_paths(make_paths(), in_features, dtype), extra_sources)
    return plan_from_timings(name, timings, available, exact)
