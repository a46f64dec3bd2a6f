"""GGUF: SmolLM2 load-to-ready against transformers, and dequantization throughput against gguf-py.

Two tables from one run (issue 4's targets: load >= 10x faster than transformers and <= 1 s;
dequantization >= 10x gguf-py's numpy ``gguf.quants.dequantize``):

1. **load**: SmolLM2-135M-Instruct Q4_1 (``scripts/fetch_smollm2.py`` fetches it) loaded to a
   ready float32 model by ``loader.load_model`` and by ``AutoModelForCausalLM.from_pretrained(dir,
   gguf_file=...)``, each in a fresh process, the order alternating, ``--reps`` times; the clock runs
   around the load call only (imports are timed separately), medians reported;
2. **dequantize**: per ggml type, one ``--rows`` x ``--cols`` tensor (quantized with gguf-py, random
   valid blocks for K-quants) decoded to float32 by gguf-py and by our torch kernels (into a new
   tensor, as gguf-py does, and into a reused one, as a load does into parameters); best of
   ``--reps``, values per second and the ratio.

Usage: ``.venv/bin/python benchmarks/bench_gguf.py [--reps 3] [--rows 4096] [--cols 4096] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

_LOAD_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
path, which = sys.argv[1], sys.argv[2]
if which == "loader":
    import loader
    from loader._pipeline.load import load_model_with_report
    load = lambda: load_model_with_report(path, dtype="float32")[0]
else:
    import os
    from transformers import AutoModelForCausalLM
    load = lambda: AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                        dtype=torch.float32)
imported = time.perf_counter() - t0
t1 = time.perf_counter()
model = load()
seconds = time.perf_counter() - t1
with torch.no_grad():
    logits = model(torch.tensor([[1, 2, 3]]))
    logits = getattr(logits, "logits", logits)
print(json.dumps({"import_seconds": imported, "load_seconds": seconds, "finite": bool(torch.isfinite(logits).all())}))
"""


def fetch_model() -> Path:
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_smollm2 import fetch_smollm2

    return Path(fetch_smollm2())


def load_once(path: Path, which: str) -> dict[str, Any]:
    env = {**os.environ, "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    done = subprocess.run([sys.executable, "-c", _LOAD_CHILD, str(path), which], capture_output=True, text=True,
                          env=env, cwd=REPO, check=False, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{which} load failed: {done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def bench_load(path: Path, reps: int) -> dict[str, Any]:
    path.read_bytes()  # warm the page cache
    runs: dict[str, list[dict[str, Any]]] = {"loader": [], "transformers": []}
    for rep in range(reps):
        order = ["loader", "transformers"] if rep % 2 == 0 else ["transformers", "loader"]
        for which in order:
            runs[which].append(load_once(path, which))
    table = {which: {"load_s": statistics.median(r["load_seconds"] for r in records),
                     "import_s": statistics.median(r["import_seconds"] for r in records),
                     "finite": all(r["finite"] for r in records)}
             for which, records in runs.items()}
    table["ratio"] = table["transformers"]["load_s"] / table["loader"]["load_s"]
    return table


def _stored(qtype: Any, rows: int, cols: int) -> Any:
    import numpy as np

    sys.path.insert(0, str(REPO))
    from tests.helpers.gguf_files import K_QUANTS, encode, random_blocks

    if qtype in K_QUANTS:
        import gguf

        block, _ = gguf.GGML_QUANT_SIZES[qtype]
        return random_blocks(qtype, rows * cols // block).reshape(rows, -1)
    values = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    return encode(values, qtype).view(np.uint8).reshape(rows, -1)


def _best(fn: Any, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_dequantize(rows: int, cols: int, reps: int) -> dict[str, dict[str, float]]:
    import gguf
    import numpy as np
    import torch

    from loader_plugin_gguf.format.dequantize import dequantize, dequantize_into
    from tests.helpers.gguf_files import K_QUANTS, QUANTIZABLE, Q

    table: dict[str, dict[str, float]] = {}
    for qtype in (*[q for q in QUANTIZABLE if q != Q.F32], *K_QUANTS):
        raw = _stored(qtype, rows, cols)
        packed = torch.from_numpy(raw.copy())
        reused = torch.empty(rows, cols)

        def numpy_path(raw: Any = raw, qtype: Any = qtype) -> Any:
            return (raw.view(np.float16).astype(np.float32) if qtype == Q.F16
                    else gguf.quants.dequantize(raw, qtype))

        ours_new = _best(lambda p=packed, q=qtype: dequantize(p, q, (rows, cols), torch.float32), reps)
        ours_into = _best(lambda p=packed, q=qtype, o=reused: dequantize_into(p, q, o), reps)
        theirs = _best(numpy_path, reps)
        values = rows * cols
        table[qtype.name] = {
            "gguf_py_Mvals_s": values / theirs / 1e6,
            "ours_new_Mvals_s": values / ours_new / 1e6,
            "ours_into_Mvals_s": values / ours_into / 1e6,
            "ratio_new": theirs / ours_new,
            "ratio_into": theirs / ours_into,
        }
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--skip-load", action="store_true", help="only the dequantization table")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    import torch

    print("$ " + shlex.join([Path(sys.executable).name, *sys.argv]))
    print(f"torch threads: {torch.get_num_threads()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '-')}")
    results: dict[str, Any] = {}
    if not args.skip_load:
        path = fetch_model()
        load = bench_load(path, args.reps)
        results["load"] = load
        print(f"\nSmolLM2-135M-Instruct Q4_1 ({path.stat().st_size / 1e6:.0f} MB) to a ready float32 model, "
              f"median of {args.reps} fresh processes:")
        print(f"{'path':14s} {'load s':>8s} {'import s':>9s}")
        for which in ("loader", "transformers"):
            print(f"{which:14s} {load[which]['load_s']:8.3f} {load[which]['import_s']:9.2f}")
        print(f"loader is {load['ratio']:.1f}x faster than transformers (target >= 10x, <= 1 s)")
    sys.path.insert(0, str(REPO))
    deq = bench_dequantize(args.rows, args.cols, args.reps)
    results["dequantize"] = deq
    print(f"\nDequantize one {args.rows}x{args.cols} tensor to float32, best of {args.reps} (M values/s):")
    print(f"{'type':6s} {'gguf-py':>9s} {'ours new':>9s} {'ours into':>10s} {'x new':>6s} {'x into':>7s}")
    for name, row in deq.items():
        print(f"{name:6s} {row['gguf_py_Mvals_s']:9.0f} {row['ours_new_Mvals_s']:9.0f} "
              f"{row['ours_into_Mvals_s']:10.0f} {row['ratio_new']:6.1f} {row['ratio_into']:7.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
