"""A Q8_0 GGUF loaded three ways: its codes kept as two int4 planes, dequantized to bfloat16, and to float32.

Q8_0 layers used to be dequantized (to bfloat16 under the default ``dtype="auto"``: two bytes a value for the
file's 1.06); they now keep their codes as the int4 kernel's two nibble planes (``int4x2``). The file is a random
Llama (hidden 1024, 8 layers, vocabulary 32000; untied Q8_0 head) written with gguf-py under ``benchmarks/out/``
once. Modes, each in a fresh process (``--reps`` times, order alternating, medians):

- ``auto`` (the default, packing at every load: ``packed_cache=False``, so the packing is what is timed):
  linears and head as ``int4x2``, the embedding as int8 codes;
- ``bf16-dequant`` (``dtype="bfloat16", format_options={"dequantize": True}``): everything dequantized to bfloat16
  — what ``auto`` held for Q8_0 linears before, plus a bfloat16 table where it had int8 codes;
- ``f32-dequant`` (``dtype="float32"``): everything dequantized to float32.

Reported: parameters + buffers against the file, load-to-ready seconds, and greedy decode ms a token (``--tokens``
after a 16-token prompt of random ids). Usage: ``.venv/bin/python benchmarks/bench_gguf_q8_0.py [--reps 3]
[--tokens 32] [--threads 2]``. Prints one Markdown table; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODES: dict[str, dict[str, Any]] = {
    "auto": {"format_options": {"packed_cache": False}},
    "bf16-dequant": {"dtype": "bfloat16", "format_options": {"dequantize": True}},
    "f32-dequant": {"dtype": "float32"},
}

_CHILD = r"""
import json, sys, time, torch
import loader
from loader._generation import greedy_tokens
path, options, tokens, threads = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
start = time.perf_counter()
model, report = loader.load_model_with_report(path, **options)
load_s = time.perf_counter() - start
held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
prompt = torch.randint(0, 32000, (16,), generator=torch.Generator().manual_seed(0)).tolist()
steps = greedy_tokens(model, prompt, tokens)
next(steps)
start = time.perf_counter()
decoded = sum(1 for _ in steps)
step_ms = (time.perf_counter() - start) / decoded * 1e3
kernels = (report.quantization or {}).get("kernels", {})
print(json.dumps({"load_s": load_s, "held": held, "step_ms": step_ms, "kernels": kernels}))
"""


def q8_0_file() -> Path:
    """The random Q8_0 Llama, written on first use."""
    sys.path.insert(0, str(REPO))
    from benchmarks.random_gguf import ensure_random_llama_gguf

    return ensure_random_llama_gguf("llama-q8_0.gguf", "Q8_0", vocab_size=32000, hidden_size=1024,
                                    intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                                    num_key_value_heads=4, rope_scaling=None)


def run_once(path: Path, options: dict[str, Any], tokens: int, threads: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), json.dumps(options), str(tokens), str(threads)],
                          capture_output=True, text=True, env=env, check=False, timeout=600)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    path = q8_0_file()
    file_mib = path.stat().st_size / 2**20
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for rep in range(args.reps):
        order = list(MODES) if rep % 2 == 0 else list(reversed(MODES))
        for mode in order:
            runs[mode].append(run_once(path, MODES[mode], args.tokens, args.threads))
    print(f"{path.name}: {file_mib:.1f} MiB; {args.threads} threads, {args.tokens} tokens, medians of {args.reps}\n")
    print("| mode | kernels | parameters + buffers MiB | ÷ file | load s | decode ms/token | ÷ f32-dequant |")
    print("|---|---|---:|---:|---:|---:|---:|")
    base = statistics.median(r["step_ms"] for r in runs["f32-dequant"])
    for mode, results in runs.items():
        held = results[0]["held"] / 2**20
        step = statistics.median(r["step_ms"] for r in results)
        load = statistics.median(r["load_s"] for r in results)
        kernels = ", ".join(f"{k} {n}" for k, n in sorted(results[0]["kernels"].items())) or "dense"
        print(f"| {mode} | {kernels} | {held:.1f} | {held / file_mib:.2f}x | {load:.3f} | {step:.1f} "
              f"| {base / step:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
