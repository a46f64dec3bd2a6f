"""One GPTQ-quantized linear layer (N = K = 4096, group 128, one token) through each CPU kernel of loader-plugin-marlin.

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gptq_kernels.py [--size 4096] [--tokens 1]``.
Prints a Markdown table (milliseconds per call, median of repetitions after
a warm-up) for the packed int4 kernel, dequantize + matmul (the reference
path) and the dense matmul, in bfloat16 and float32; 8-bit channelwise
through the int8 kernel as well. This is the measurement ``kernels.py``'s
``auto`` choice rests on.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from loader_plugin_marlin.gptq_format import gptq_to_quantized
from loader_plugin_marlin.kernels import choose_kernel
from loader_plugin_marlin.quantized_weight import QuantizedWeight
from tests.helpers.gptq_checkpoints import pack_gptq, quantize


def _ms(call: Callable[[], object], repetitions: int) -> float:
    call()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _measure(weight: QuantizedWeight, dense: torch.Tensor, dtype: torch.dtype,
             tokens: int) -> tuple[str, float, float, float]:
    x = torch.randn(tokens, dense.shape[1], dtype=dtype)
    packed = choose_kernel(weight, "auto", dtype)
    reference = choose_kernel(weight, "dequantize", dtype)
    w = dense.to(dtype)
    return (packed.choice.kernel, _ms(lambda: packed.matmul(x), 20), _ms(lambda: reference.matmul(x), 3),
            _ms(lambda: x @ w.t(), 20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=1)
    args = parser.parse_args()
    torch.manual_seed(0)
    dense = torch.randn(args.size, args.size) * 0.02
    rows = []
    for bits, group in ((4, 128), (8, -1)):
        q = quantize(dense, bits, group, sym=True)
        t = pack_gptq(q)
        weight = gptq_to_quantized(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], bits=bits, group_size=group,
                                   zeros_minus_one=True)
        for dtype in (torch.bfloat16, torch.float32):
            rows.append((f"{bits}-bit g{group}", str(dtype).removeprefix("torch."),
                         *_measure(weight, dense, dtype, args.tokens)))
    print(f"N = K = {args.size}, {args.tokens} token(s), torch {torch.__version__}, "
          f"{torch.get_num_threads()} thread(s)\n")
    print("| weight | dtype | packed kernel | packed ms | dequantize + matmul ms | dense matmul ms |")
    print("|---|---|---|---:|---:|---:|")
    for name, dtype_name, kernel, packed_ms, dequant_ms, dense_ms in rows:
        print(f"| {name} | {dtype_name} | {kernel} | {packed_ms:.2f} | {dequant_ms:.1f} | {dense_ms:.2f} |")


if __name__ == "__main__":
    main()
