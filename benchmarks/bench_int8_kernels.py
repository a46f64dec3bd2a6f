"""int8 CPU matmuls for W8A8 / W8A16 layers, each kernel timed in a fresh process (medians).

Kernels, for a weight ``[N, K]`` of int8 codes with a scale per output channel (or per group of input
columns) and activations ``x [M, K]``:

* ``dequant_fp32`` / ``dequant_bf16``: the weight dequantized once, then ``F.linear``;
* ``int8pack_fp32`` / ``int8pack_bf16``: torch's weight-only int8 kernel (``_weight_int8pack_mm``);
* ``int_mm_dynamic``: ``torch._int_mm`` on activations quantized per token at each call (W8A8, vLLM's math);
* grouped weights (``--group``): ``grouped_partials`` (one ``_weight_int8pack_mm`` per group, summed),
  ``grouped_planes`` (two int4 planes, scales repeated per 32 columns), ``dequant_per_call`` (today's fallback).

Run: ``OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.bench_int8_kernels [--k 2048 --n 8192]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

from loader.kernels import pack_int8_grouped

KERNELS = ("dequant_fp32", "dequant_bf16", "int8pack_fp32", "int8pack_bf16", "int_mm_dynamic")
GROUPED = ("grouped_partials", "grouped_planes", "grouped_bf16_once", "dequant_per_call")


def _setup(kernel: str, m: int, k: int, n: int, group: int):
    torch.manual_seed(0)
    codes = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    scales = torch.rand(n) / 100
    x = torch.randn(m, k)
    if kernel.startswith("dequant_") and kernel != "dequant_per_call":
        dtype = torch.float32 if kernel.endswith("fp32") else torch.bfloat16
        w, xd = (codes.float() * scales[:, None]).to(dtype), x.to(dtype)
        return lambda: torch.nn.functional.linear(xd, w)
    if kernel.startswith("int8pack_"):
        dtype = torch.float32 if kernel.endswith("fp32") else torch.bfloat16
        xd, s = x.to(dtype), scales.to(dtype)
        return lambda: torch.ops.aten._weight_int8pack_mm(xd, codes, s)
    if kernel == "int_mm_dynamic":
        wt = codes.t()

        def w8a8() -> torch.Tensor:
            x_scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-8) / 127
            xq = torch.round(x / x_scale).to(torch.int8)
            return torch._int_mm(xq, wt).to(torch.float32) * x_scale * scales
        return w8a8
    groups = k // group
    gscales = torch.rand(groups, n) / 100
    if kernel == "grouped_partials":
        per_group = [codes[:, g * group:(g + 1) * group].contiguous() for g in range(groups)]
        xb = x.to(torch.bfloat16)
        s_b = gscales.to(torch.bfloat16)

        def partials() -> torch.Tensor:
            out = torch.zeros(m, n)
            for g in range(groups):
                out += torch.ops.aten._weight_int8pack_mm(xb[:, g * group:(g + 1) * group], per_group[g], s_b[g])
            return out
        return partials
    if kernel == "grouped_planes":  # each group's scale repeated over its blocks of 32 columns
        blocks = gscales.repeat_interleave(group // 32, 0)
        packed = pack_int8_grouped(codes.view(n, k // 32, 32), blocks, torch.bfloat16)
        xb = x.to(torch.bfloat16)
        return lambda: packed.matmul(xb)
    full = gscales.repeat_interleave(group, 0).t()
    if kernel == "grouped_bf16_once":
        w, xb = (codes.float() * full).to(torch.bfloat16), x.to(torch.bfloat16)
        return lambda: torch.nn.functional.linear(xb, w)
    return lambda: torch.nn.functional.linear(x, codes.float() * full)


def _child(kernel: str, m: int, k: int, n: int, group: int, reps: int) -> float:
    run = _setup(kernel, m, k, n, group)
    for _ in range(2):
        run()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--k", type=int, default=2048)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--group", type=int, default=0, help="time grouped kernels with this group size")
    parser.add_argument("--runs", type=int, default=5, help="fresh processes per kernel and M (interleaved rounds)")
    parser.add_argument("--child", nargs=5)
    args = parser.parse_args()
    if args.child:
        kernel, m, k, n, group = args.child
        print(_child(kernel, int(m), int(k), int(n), int(group), reps=5 if int(m) > 1 else 50))
        return
    kernels = [kernel for kernel in (GROUPED if args.group else KERNELS)
               if kernel != "grouped_planes" or args.group % 32 == 0]
    runs: dict[str, dict[int, list[float]]] = {}
    for _ in range(args.runs):  # rounds over every kernel, so a change in the machine's load hits all of them
        for kernel in kernels:
            for m in (1, 128):
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_int8_kernels", "--child", kernel, str(m), str(args.k),
                     str(args.n), str(args.group)], check=True, capture_output=True, text=True, env={**os.environ})
                runs.setdefault(kernel, {}).setdefault(m, []).append(float(done.stdout))
    results = {kernel: {m: round(statistics.median(times), 3) for m, times in by_m.items()}
               for kernel, by_m in runs.items()}
    print(json.dumps({"k": args.k, "n": args.n, "group": args.group or None,
                      "threads": os.environ.get("OMP_NUM_THREADS"), "ms": results}, indent=1))


if __name__ == "__main__":
    main()
