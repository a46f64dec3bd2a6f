"""Every quantized path against its dequantized twin, per format, activation dtype and tokens (issue 35).

Per-layer timings of the 1 GB Llama's decoder layer (``benchmarks/checkpoints.py``: hidden 2048, intermediate
5632, 16 heads, 4 KV heads: ``qkv_proj`` 2048->3072, ``o_proj`` 2048->2048, ``gate_up_proj`` 2048->11264,
``down_proj`` 5632->2048), each a whole layer of that shape (``--rows N`` times the first N output rows and
scales, quicker but it flatters the dequantized twin: a slice inside one dequantized tile skips the per-tile
costs). The four linears summed are one twenty-second of the model's linear work; a whole-model run of 10
formats x 2 dtypes x 5 input sizes x every path does not fit the minutes a benchmark may take on this 2-core
machine, and attention, norms and the head are the same for every path. Random weights per format:

- W4A16 group 32 / 64 / 128 / channel and W8A16 group 32 / group 128 / channel: the Marlin plugin's CPU kernels
  (``int4pack``, ``int8planes``, ``int8groups``, ``int8pack``) as its chooser builds them for a load of that
  dtype (a float32 load packs bfloat16 scales);
- GGUF Q4_0 / Q4_K / Q8_0: the core weights the GGUF plugin keeps (int4 with a scale per 32, Q4_0 ``z = 0``,
  Q4_K affine; Q8_0 as two int4 planes), bfloat16 kernel dtype.

Each format runs in a fresh process with an empty timings cache, so the loader's chooser times this machine
(its first-use micro-benchmark, :func:`loader.kernels.measure_rows`) and plans every layer; then every path is
timed here, interleaved over ``--rounds`` rounds (the fastest call kept), at 1, 8, 37, 128 and 512 tokens, with
``--threads`` threads: ``packed`` (the kernel in the activations' dtype), ``packed-bf16`` (float32
activations cast), ``dequantize`` (the dequantized twin: the same weights dequantized and multiplied every
call; timed twice in the same rounds, the two timings' spread is the run's noise) and ``dense`` (the
dequantized weight kept: the dense model's matmul, for reference; not a default). The table sums the four
layers; ``default`` is what the plan runs at that input size. A row **fails loudly** (``SLOWER THAN
DEQUANTIZED`` / ``> 1.2x FASTEST``) when the default path is slower than the dequantized twin by more than the
twin's own spread (at least 2 %), or more than 1.2x the fastest quantized path, in this run. Nothing is asserted.

    python benchmarks/bench_kernel_paths.py                  # ~6 minutes
    python benchmarks/bench_kernel_paths.py --formats W4A16-g64 --tokens 1,37 --rounds 2   # a quick look
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
TAG = "kernel-paths"
ROWS = [0]
"""Output rows each shape is timed over (``--rows``; 0: the whole layer)."""
SHAPES = {"qkv_proj": (2048, 3072), "o_proj": (2048, 2048), "gate_up_proj": (2048, 11264),
          "down_proj": (5632, 2048)}
"""Input features, output features of each linear of a decoder layer."""
FORMATS = ("W4A16-g32", "W4A16-g64", "W4A16-g128", "W4A16-channel", "W8A16-g32", "W8A16-g128", "W8A16-channel",
           "GGUF-Q4_0", "GGUF-Q4_K", "GGUF-Q8_0")
DTYPES = ("float32", "bfloat16")
ALL_TOKENS = (1, 8, 37, 128, 512)
TOKENS = list(ALL_TOKENS)
"""The input sizes of this run (``--tokens``)."""
QUANTIZED_PATHS = ("packed", "packed-bf16", "dequantize")
AGAIN = "dequantize#again"
"""The dequantized twin timed a second time in the same rounds: the two timings' spread is this run's noise."""
MIN_NOISE = 0.02


def _marlin_weight(fmt: str, k: int, n: int, act: Any) -> Any:
    """The Marlin plugin's kernel for a random weight, planned by its chooser for activations ``act``."""
    import torch

    from loader_plugin_marlin.kernel_paths import DenseBudget, kernel_dtype_for, path_weight, with_paths
    from loader_plugin_marlin.kernels import choose_kernel
    from loader_plugin_marlin.quantized_weight import QuantizedWeight, default_g_idx

    bits = 4 if fmt.startswith("W4") else 8
    group = -1 if fmt.endswith("channel") else int(fmt.rsplit("-g", 1)[1])
    groups = 1 if group == -1 else k // group
    generator = torch.Generator().manual_seed(k + n)
    weight = QuantizedWeight(
        codes=torch.randint(0, 1 << bits, (k, n), dtype=torch.uint8, generator=generator),
        scales=torch.rand(groups, n, generator=generator) / 100,
        zeros=torch.full((groups, n), 1 << (bits - 1), dtype=torch.int32),
        g_idx=default_g_idx(k, group), bits=bits, group_size=group)
    kernel = choose_kernel(weight, "auto", kernel_dtype_for(act, False))
    planned = with_paths(kernel, act, exact=False, budget=DenseBudget(0))
    return path_weight(planned), planned.choice.paths[0], planned.choice.kernel


def _gguf_weight(fmt: str, k: int, n: int, act: Any) -> Any:
    """The core weight the GGUF plugin keeps for such blocks (bfloat16 kernel), planned as the plugin plans."""
    import torch

    from loader.kernels import pack_int4, pack_int8_grouped, plan_weight_paths

    generator = torch.Generator().manual_seed(k + n)
    scales = torch.rand(k // 32, n, generator=generator) / 100
    if fmt == "GGUF-Q8_0":
        codes = torch.randint(-128, 128, (n, k // 32, 32), dtype=torch.int8, generator=generator)
        weight, kernel = pack_int8_grouped(codes, scales, torch.bfloat16), "int4x2"
    else:
        codes = torch.randint(0, 16, (n, k), generator=generator)
        biases = -8 * scales if fmt == "GGUF-Q4_0" else -torch.rand(k // 32, n, generator=generator) / 10
        weight, kernel = pack_int4(codes, scales, biases, 32, torch.bfloat16), "int4"
    plan = plan_weight_paths(weight, f"gguf:{kernel}:bfloat16", act)
    return weight, plan, kernel


def _time(weight: Any, path: str, x: Any, dense: Any) -> float:
    """Seconds per call, calls under 2 ms repeated and averaged (one preempted call is not the sample)."""
    from loader.kernels import run_path

    count, start = 0, time.perf_counter()
    path = path.split("#")[0]  # AGAIN: the twin timed a second time
    while True:
        run_path(weight, path, x, dense)
        count += 1
        elapsed = time.perf_counter() - start
        if elapsed >= 2e-3 or count >= 32:
            return elapsed / count


def _child(fmt: str, rounds: int) -> dict[str, Any]:
    """One format: plan and time every layer shape, dtype and input size; seconds scaled to whole layers."""
    import torch

    from loader.kernels import available_paths, run_path

    results: dict[str, Any] = {"format": fmt, "rows": []}
    for dtype_name in DTYPES:
        act = getattr(torch, dtype_name)
        for shape, (k, n) in SHAPES.items():
            build = _gguf_weight if fmt.startswith("GGUF") else _marlin_weight
            whole, plan, kernel = build(fmt, k, n, act)
            rows = min(n, ROWS[0] or n)
            weight = whole.rows(0, rows)
            dense = weight.dequantize(act)
            paths = [*available_paths(weight, act), "dense", AGAIN]
            for tokens in TOKENS:
                x = torch.randn(tokens, k, generator=torch.Generator().manual_seed(tokens)).to(act)
                best: dict[str, float] = {}
                with torch.inference_mode():
                    for path in paths:
                        run_path(weight, path.split("#")[0], x, dense)  # warm-up
                    for _ in range(rounds):
                        for path in paths:
                            seconds = _time(weight, path, x, dense)
                            best[path] = min(seconds, best.get(path, seconds))
                scale = n / rows
                results["rows"].append({"dtype": dtype_name, "shape": shape, "tokens": tokens, "kernel": kernel,
                                        "default": plan.path_for(tokens), "source": plan.source,
                                        "seconds": {p: s * scale for p, s in best.items()}})
    return results


def _summaries(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (format, dtype, tokens): the four layers summed, per path and for the default."""
    out = []
    for result in results:
        for dtype_name in DTYPES:
            for tokens in TOKENS:
                rows = [r for r in result["rows"] if r["dtype"] == dtype_name and r["tokens"] == tokens]
                if not rows:
                    continue
                total: dict[str, float] = {}
                for row in rows:
                    for path, seconds in row["seconds"].items():
                        total[path] = total.get(path, 0.0) + seconds
                default = sum(row["seconds"][row["default"]] for row in rows)
                quantized = {p: s for p, s in total.items() if p in QUANTIZED_PATHS}
                fastest = min(quantized, key=lambda p: quantized[p])
                out.append({"format": result["format"], "dtype": dtype_name, "tokens": tokens,
                            "kernel": rows[0]["kernel"], "defaults": sorted({r["default"] for r in rows}),
                            "default_s": default, "twin_s": total["dequantize"], "fastest": fastest,
                            "noise": max(MIN_NOISE, abs(total["dequantize"] - total[AGAIN]) / min(
                                total["dequantize"], total[AGAIN])),
                            "fastest_s": quantized[fastest], "dense_s": total.get("dense")})
    return out


def _verdict(row: dict[str, Any]) -> str:
    flags = []
    if row["default_s"] > row["twin_s"] * (1 + row["noise"]):
        flags.append("**SLOWER THAN DEQUANTIZED**")
    if row["default_s"] > 1.2 * row["fastest_s"]:
        flags.append("**> 1.2x FASTEST**")
    return ", ".join(flags) or "ok"


def render(summaries: list[dict[str, Any]], header: str, command: str) -> str:
    lines = [header, "", "| format | dtype | tokens | kernel | default path | default ms | dequantized twin ms | "
             "fastest quantized | default / twin | twin timed twice: spread | default / fastest | "
             "dense kept ms (ref.) | verdict |",
             "|---|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|---|"]
    for row in summaries:
        lines.append(
            f"| {row['format']} | {row['dtype']} | {row['tokens']} | {row['kernel']} | {'+'.join(row['defaults'])} | "
            f"{row['default_s'] * 1e3:.2f} | {row['twin_s'] * 1e3:.2f} | {row['fastest']} "
            f"{row['fastest_s'] * 1e3:.2f} | {row['default_s'] / row['twin_s']:.3f} | {row['noise']:.1%} | "
            f"{row['default_s'] / row['fastest_s']:.2f} | {(row['dense_s'] or 0) * 1e3:.2f} | {_verdict(row)} |")
    failing = [r for r in summaries if _verdict(r) != "ok"]
    lines += ["", f"Rows failing: {len(failing)} of {len(summaries)}.", "", f"Reproduce: `{command}`"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--tokens", default=",".join(map(str, ALL_TOKENS)))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, default=0, help="time each shape on its first ROWS output rows, scaled "
                        "to the whole layer (0, the default: the whole layer)")
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md's kernel-paths section")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    TOKENS[:] = [int(t) for t in args.tokens.split(",")]
    ROWS[0] = args.rows
    if args.child:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(_child(args.child, args.rounds)))
        return 0
    results, began = [], time.monotonic()
    loads = [os.getloadavg()[0]]
    for fmt in args.formats.split(","):
        with tempfile.TemporaryDirectory(prefix="kernel-paths-") as cache:  # the chooser times this run
            env = {**os.environ, "LOADER_CACHE_DIR": cache, "OMP_NUM_THREADS": str(args.threads),
                   "LOADER_KERNEL_MEASURE": "1"}
            out = subprocess.run([sys.executable, __file__, "--child", fmt, "--rounds", str(args.rounds),
                                  "--threads", str(args.threads), "--tokens", args.tokens, "--rows", str(args.rows)],
                                 env=env, cwd=REPO, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
        loads.append(os.getloadavg()[0])
        print(f"{fmt}: done ({time.monotonic() - began:.0f} s)", file=sys.stderr, flush=True)
    from benchmarks.machine import describe_machine, describe_software

    command = "python benchmarks/bench_kernel_paths.py " + shlex.join(sys.argv[1:])
    header = "\n".join([
        "## Kernel paths per dtype and input size: every quantized path against its dequantized twin (issue 35)",
        "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {time.monotonic() - began:.0f} s",
        f"- Machine: {describe_machine()}",
        f"- Software: {describe_software(REPO)}",
        f"- 1-min load average at each format's start: {', '.join(f'{v:.2f}' for v in loads)} (this benchmark's "
        f"own {args.threads} threads count; more is other work on the machine); rounds are interleaved so each "
        "comparison sees the same load",
        f"- Per-layer timings, {args.threads} threads, fastest of {args.rounds} interleaved rounds, "
        + (f"each shape on its first {args.rows} rows scaled to the whole layer" if args.rows else
           "each a whole layer") + ", the four linears of one decoder layer of the 1 GB Llama summed (see the "
        "script's docstring)",
    ])
    table = render(_summaries(results), header, command)
    from benchmarks.report import show_section

    show_section(table, args.results, TAG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
