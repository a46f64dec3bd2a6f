"""SmolLM2-135M W4A16 (group 64, llm-compressor) in float32: a 37-token forward against the dense float32 model.

The checkpoint is the issue's: the real SmolLM2 GGUF dequantized to a float32 ``transformers`` checkpoint
(``tests/helpers/gguf_dense.py``, in this repo's venv), then quantized by llm-compressor 0.14 (round to
nearest, ``pack-quantized``, symmetric int4 with a scale per 64 inputs; llm-compressor's own venv, pinned by
``constraints-llmcompressor.txt``: ``--llmc-python``). Its config says ``torch_dtype: float32``, so
``dtype="auto"`` loads float32. Each path is timed in a fresh process (median of ``--reps`` forwards after a
warm-up, ``--threads`` threads), the paths interleaved over ``--rounds``:

``dense``      the float32 checkpoint (loader, safetensors);
``default``    the W4A16 checkpoint with default options (the kernel paths measured on this machine);
``exact``      the same with ``quantization_options={"exact_float32": True}``.

The logits of ``default`` are compared with ``exact`` (float32 arithmetic on the dequantized weight), the
reference the docs state the tolerance against. Prints a table and the command; asserts nothing.

    python benchmarks/bench_smollm2_w4a16.py --llmc-python /root/llmc/bin/python
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out" / "smollm2-w4a16"
TOKENS = 37
PATHS = ("dense", "default", "exact")
TAG = "kernel-paths-smollm2"


def _build_dense(folder: Path) -> None:
    from tests.helpers.gguf_dense import fetch_smollm2_gguf, save_dense_from_gguf

    save_dense_from_gguf(fetch_smollm2_gguf(), folder)


def _quantize(dense: Path, root: Path) -> None:
    """Run under llm-compressor's venv: W4A16, symmetric, group 64 (SmolLM2's K=576 takes no group 128)."""
    from llmcompressor.modifiers.quantization import QuantizationModifier

    from tests.helpers.llmcompressor_checkpoints import quantize_pretrained

    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 64}
    recipe = QuantizationModifier(config_groups={"group_0": {"targets": ["Linear"], "weights": weights}},
                                  ignore=["lm_head"])
    quantize_pretrained(dense, root, recipe)


def _checkpoints(llmc_python: str) -> tuple[Path, Path]:
    dense, quantized = OUT / "dense", OUT / "quantized"
    if not (dense / "config.json").exists():
        subprocess.run([sys.executable, __file__, "--stage", "dense"], check=True, cwd=REPO)
    if not (quantized / "config.json").exists():
        subprocess.run([llmc_python, __file__, "--stage", "quantize"], check=True, cwd=REPO)
    return dense, quantized


def _child(path: str, folder: Path, reps: int, threads: int) -> None:
    """One process: load, warm up, time ``reps`` forwards of 37 tokens; print JSON (and keep the logits)."""
    import torch

    import loader

    torch.set_num_threads(threads)
    options = {"exact_float32": True} if path == "exact" else None
    model, report = loader.load_model_with_report(str(folder), dtype="auto", quantization_options=options)
    ids = torch.randint(3, 49152, (1, TOKENS), generator=torch.Generator().manual_seed(0))
    seconds = []
    with torch.inference_mode():
        logits = model(ids)
        for _ in range(reps):
            start = time.perf_counter()
            model(ids)
            seconds.append(time.perf_counter() - start)
    torch.save(logits, OUT / f"logits-{path}.pt")
    layers = (report.quantization or {}).get("layers", {})
    first = next(iter(layers.values()), {})
    print(json.dumps({"path": path, "median_s": statistics.median(seconds),
                      "dtype": str(next(model.parameters()).dtype), "paths": first.get("by_tokens")}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llmc-python", default="/root/llmc/bin/python")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md's section")
    parser.add_argument("--stage", choices=("dense", "quantize", "child"), help=argparse.SUPPRESS)
    parser.add_argument("--path", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.stage == "dense":
        _build_dense(OUT / "dense")
        return 0
    if args.stage == "quantize":
        _quantize(OUT / "dense", OUT)
        return 0
    if args.stage == "child":
        _child(args.path, OUT / ("dense" if args.path == "dense" else "quantized"), args.reps, args.threads)
        return 0
    _checkpoints(args.llmc_python)
    runs: dict[str, list[float]] = {path: [] for path in PATHS}
    plans: dict[str, object] = {}
    for _ in range(args.rounds):
        for path in PATHS:
            out = subprocess.run([sys.executable, __file__, "--stage", "child", "--path", path, "--reps",
                                  str(args.reps), "--threads", str(args.threads)], check=True, cwd=REPO,
                                 capture_output=True, text=True).stdout
            record = json.loads(out.strip().splitlines()[-1])
            runs[path].append(record["median_s"])
            plans[path] = record["paths"]
    _report(runs, plans, args)
    return 0


def _report(runs: dict[str, list[float]], plans: dict[str, object], args: argparse.Namespace) -> None:
    import os
    from datetime import UTC, datetime

    import torch

    from benchmarks.machine import describe_machine

    dense = statistics.median(runs["dense"])
    exact = torch.load(OUT / "logits-exact.pt")
    lines = [
        "## SmolLM2-135M W4A16 (group 64, llm-compressor) in float32: a 37-token forward (issue 35)", "",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; machine: {describe_machine()}",
        f"- 1-min load average at the end: {os.getloadavg()[0]:.2f} (the benchmark's own {args.threads} threads "
        "count; more is other work on the machine)",
        f"- {TOKENS}-token forward, {args.threads} threads, {args.rounds} fresh processes per path (interleaved) x "
        f"{args.reps} forwards after a warm-up; medians; `dtype=\"auto\"` (the checkpoint says float32)", "",
        "| path | seconds | vs dense float32 | logits vs exact float32 (rel., norm) | paths of the first layer |",
        "|---|---:|---:|---:|---|"]
    for path in PATHS:
        seconds = statistics.median(runs[path])
        logits = torch.load(OUT / f"logits-{path}.pt")
        error = f"{float((logits - exact).norm() / exact.norm()):.2e}" if path != "dense" else "-"
        lines.append(f"| {path} | {seconds:.3f} | {seconds / dense:.2f}x | {error} | {plans[path]} |")
    lines += ["", f"Reproduce: `python benchmarks/bench_smollm2_w4a16.py {shlex.join(sys.argv[1:])}`"]
    print("\n".join(lines))
    if args.results:
        from benchmarks.report import replace_block

        existing = args.results.read_text() if args.results.exists() else ""
        args.results.write_text(replace_block(existing, TAG, "\n".join(lines)))


if __name__ == "__main__":
    sys.exit(main())
