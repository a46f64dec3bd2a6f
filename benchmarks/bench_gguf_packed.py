"""GGUF kept packed (``quantization="gguf"``) against today's dequantized load: SmolLM2 time, memory, decode.

For SmolLM2-135M-Instruct Q4_1 (``scripts/fetch_smollm2.py``), each path in a fresh process, the order
alternating, ``--reps`` times (medians): load-to-ready seconds (the clock around ``load_model`` only),
the RSS the load added (after minus before, from ``/proc/self/statm``), the process's peak RSS, the
bytes of the model's parameters and buffers, and greedy decode tokens/s for ``--tokens`` new tokens of
the chat question (the answer is printed so a wrong one is seen). Both paths load with
``dtype="float32"``; the packed one multiplies its Q4 linears in bfloat16 (issue 17).

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_gguf_packed.py [--reps 3] [--tokens 20]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PATHS = {"packed": "gguf", "dequantized": None}

_CHILD = r"""
import json, os, resource, sys, time
import torch
import loader
from loader._generation import generate_greedy, tokenizer_for

def rss():
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

path, quantization, tokens = sys.argv[1], (sys.argv[2] if sys.argv[2] != "-" else None), int(sys.argv[3])
bundle = tokenizer_for(path)
before = rss()
t0 = time.perf_counter()
model = loader.load_model(path, dtype="float32", quantization=quantization)
seconds = time.perf_counter() - t0
added = rss() - before
held = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
t1 = time.perf_counter()
result = generate_greedy(model, bundle, "What is the capital of France?", max_new_tokens=tokens, chat=True)
decode = time.perf_counter() - t1
print(json.dumps({"load_s": seconds, "rss_added": added, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                  * 1024, "model_bytes": held, "tokens_s": tokens / decode, "answer": result.text}))
"""


def run_once(path: Path, name: str, tokens: int) -> dict[str, Any]:
    env = {**os.environ, "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), PATHS[name] or "-", str(tokens)],
                          capture_output=True, text=True, env=env, cwd=REPO, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{name} failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_smollm2 import fetch_smollm2

    path = Path(fetch_smollm2())
    path.read_bytes()  # warm the page cache
    print("$ " + shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}, file {path.stat().st_size / 1e6:.0f} MB")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in PATHS}
    for rep in range(args.reps):
        for name in (list(PATHS) if rep % 2 == 0 else list(reversed(PATHS))):
            runs[name].append(run_once(path, name, args.tokens))
    table = {name: {key: statistics.median(r[key] for r in records)
                    for key in ("load_s", "rss_added", "peak_rss", "model_bytes", "tokens_s")}
             | {"answer": records[-1]["answer"]} for name, records in runs.items()}
    print(f"\nmedian of {args.reps} fresh processes:")
    print(f"{'path':12s} {'load s':>7s} {'RSS added':>10s} {'peak RSS':>9s} {'model':>8s} {'tok/s':>6s}  answer")
    for name, row in table.items():
        print(f"{name:12s} {row['load_s']:7.3f} {row['rss_added'] / 1e6:8.0f}MB {row['peak_rss'] / 1e6:7.0f}MB "
              f"{row['model_bytes'] / 1e6:6.0f}MB {row['tokens_s']:6.1f}  {row['answer']!r}")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "median": table}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
