"""FP8 CPU matmuls for an FP8 layer, each kernel timed in a fresh process (medians of 15 calls after 3 warm-ups).

For a weight ``[N, K]`` of ``float8_e4m3fn`` values with per-row scales and activations ``x [M, K]`` (float32):

* ``dequant_fp32`` / ``dequant_bf16``: the weight dequantized once at load, then ``F.linear`` (the loader's
  ``fp8_dequantized``);
* ``dequant_fp32_rounded_input``: the same with the input rounded to FP8 per token first (compressed-tensors'
  and fbgemm's activation emulation);
* ``scaled_mm_tensor`` / ``scaled_mm_rowwise``: the FP8 weight kept, the input quantized per tensor / per token
  at each call, ``torch._scaled_mm`` (float32 out; the loader's ``fp8_scaled_mm``);
* ``upcast_per_call``: the FP8 weight kept and converted to bfloat16 at each call (half the memory of bf16).

Run: ``OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.bench_fp8_kernels [--n 4096 --k 4096]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

KERNELS = ("dequant_fp32", "dequant_bf16", "dequant_fp32_rounded_input", "scaled_mm_tensor", "scaled_mm_rowwise",
           "upcast_per_call")
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0


def _quantized_input(x: torch.Tensor, per_row: bool) -> tuple[torch.Tensor, torch.Tensor]:
    amax = x.abs().amax(dim=-1, keepdim=True) if per_row else x.abs().amax()
    scale = (amax / FP8_MAX).clamp(min=1e-12)
    return (x / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def _kernel(name: str, m: int, n: int, k: int) -> Callable[[], torch.Tensor]:
    torch.manual_seed(0)
    weight = (torch.randn(n, k) * 0.05).to(FP8)
    scale = torch.rand(n, 1) * 0.01 + 0.001
    x = torch.randn(m, k)
    if name.startswith("dequant"):
        dtype = torch.bfloat16 if name == "dequant_bf16" else torch.float32
        dense, xs = (weight.to(torch.float32) * scale).to(dtype), x.to(dtype)
        if name == "dequant_fp32_rounded_input":
            def rounded() -> torch.Tensor:
                xq, x_scale = _quantized_input(x, True)
                return F.linear(xq.to(torch.float32) * x_scale, dense)
            return rounded
        return lambda: F.linear(xs, dense)
    if name.startswith("scaled_mm"):
        per_row = name == "scaled_mm_rowwise"
        weight_scale = scale.reshape(1, -1) if per_row else scale.amax().reshape(())

        def scaled_mm() -> torch.Tensor:
            xq, x_scale = _quantized_input(x, per_row)
            return torch._scaled_mm(xq, weight.t(), scale_a=x_scale if per_row else x_scale.reshape(()),
                                    scale_b=weight_scale, out_dtype=torch.float32)
        return scaled_mm
    row_scale = scale.to(torch.bfloat16)
    return lambda: F.linear(x.to(torch.bfloat16), weight.to(torch.bfloat16) * row_scale)


def measure(name: str, m: int, n: int, k: int) -> float:
    """Median milliseconds of one call of kernel ``name`` in this process."""
    call = _kernel(name, m, n, k)
    for _ in range(3):
        call()
    times = []
    for _ in range(15):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--one", nargs=2, metavar=("KERNEL", "M"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.n, args.k)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    for m in args.tokens:
        for name in KERNELS:
            done = subprocess.run([sys.executable, "-m", "benchmarks.bench_fp8_kernels", "--n", str(args.n), "--k",
                                   str(args.k), "--one", name, str(m)], env=env, capture_output=True, text=True,
                                  check=True)
            print(f"M={m:<3} {name:<28} {float(done.stdout):9.3f} ms", flush=True)


if __name__ == "__main__":
    main()
