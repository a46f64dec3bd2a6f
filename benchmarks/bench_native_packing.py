"""The compiled packing helpers against torch's packing, one SmolLM2-shaped layer at a time, in one process.

Each helper (:mod:`loader.kernels.native_packing`) and the torch code it replaces write the same bytes; this
times both on random blocks of SmolLM2-135M's shapes (Q4_1 linears, the Q8_0 tied embedding's planes), a
fresh output each call as a load allocates one, alternating the two, and prints medians, their ratio, and
the one-time build of the library into an empty cache folder.

Usage: ``python benchmarks/bench_native_packing.py [--reps 15] [--threads 2]``. Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent

Q4_1_LAYERS = (("qkv_proj", 960, 576), ("o_proj", 576, 576), ("gate_up_proj", 3072, 576), ("down_proj", 576, 1536))
EMBEDDING = ("embedding planes (Q8_0)", 49152, 576)


def _blocks(rows: int, cols: int, size: int) -> torch.Tensor:
    """Random blocks whose leading float16 fields are finite, small scales (as a real file's are)."""
    generator = torch.Generator().manual_seed(rows + cols)
    blocks = torch.randint(0, 256, (rows, cols // 32, size), dtype=torch.uint8, generator=generator)
    fields = (torch.rand(rows, cols // 32, 2, generator=generator) * 1e-2).to(torch.float16)
    blocks[:, :, :4] = fields.view(torch.uint8)
    return blocks


def _median_ms(call: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _switch(native: bool) -> None:
    from loader.kernels import native_repack

    os.environ["LOADER_NATIVE_REPACK"] = "1" if native else "0"
    native_repack.cache_clear()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(REPO))
    from benchmarks.machine import describe_machine
    from loader.kernels import native_repack, pack_int8_grouped
    from loader_plugin_gguf.packed.half_split import pack_int4_half_split_parts
    from loader_plugin_gguf.packed.q4_blocks import HalfSplitRows

    with tempfile.TemporaryDirectory() as cache:
        os.environ["LOADER_CACHE_DIR"] = cache
        native_repack.cache_clear()
        start = time.perf_counter()
        built = native_repack()
        build_s = time.perf_counter() - start
    if built is None:
        print("no compiled helpers here; nothing to compare", file=sys.stderr)
        return 1

    def q4_layer(rows: int, cols: int) -> Callable[[], object]:
        part = HalfSplitRows(_blocks(rows, cols, 20), 2)

        def pack() -> object:
            scales = torch.empty(cols // 32, rows, 2, dtype=torch.bfloat16)
            part.scales_and_zeros_into(scales)
            return pack_int4_half_split_parts([part.qs], scales)
        return pack

    def q8_planes(rows: int, cols: int) -> Callable[[], object]:
        blocks = _blocks(rows, cols, 34)
        codes, scales = blocks[:, :, 2:], blocks[:, :, :2].contiguous().view(torch.float16)[..., 0].t().float()
        return lambda: pack_int8_grouped(codes, scales)

    cases = [(f"{name} [{rows}, {cols}] Q4_1", q4_layer(rows, cols)) for name, rows, cols in Q4_1_LAYERS]
    cases.append((f"{EMBEDDING[0]} [{EMBEDDING[1]}, {EMBEDDING[2]}]", q8_planes(*EMBEDDING[1:])))
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {describe_machine()}, threads {args.threads}, "
          f"median of {args.reps}; SSE2 build: {built.simd}; first build into an empty cache {build_s:.2f} s\n")
    print("| case | torch ms | compiled ms | torch ÷ compiled |\n|---|---:|---:|---:|")
    for label, call in cases:
        medians: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(3):  # alternate, so a slow phase of a shared machine hits both
            for native in (True, False):
                _switch(native)
                call()
                medians[native].append(_median_ms(call, args.reps))
        ours, theirs = statistics.median(medians[True]), statistics.median(medians[False])
        print(f"| {label} | {theirs:.2f} | {ours:.2f} | {theirs / ours:.1f}x |")
    _switch(True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
