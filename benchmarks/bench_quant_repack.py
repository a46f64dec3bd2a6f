"""Quantized repacks at the floor: GPTQ and Q4_K load-to-ready against the bf16 mapped load and llama.cpp.

One run, every path in a fresh process (the order alternating between repetitions, medians of ``--reps``), the
page cache warm (each file read once first). Each loader process first loads a small checkpoint of the same kind,
untimed (``--cold`` skips it), so the timed load finds loader, torch and the plugin imported as in a serving
process, and the compiled packing helpers built (they are built once per machine and cached).

- ``bf16``: ``load_model`` of the 1 GB random bf16 Llama (mapped weights), the floor the GPTQ loads are held to;
- ``gptq-first``: the same model as 4-bit GPTQ (symmetric, group 128; ``bench_gptq_forward.ensure_gptq``) with
  its packed-weights bundles removed first: the layers are packed from their words by the compiled helper and the
  bundle is written (``LOADER_MARLIN_PACKED_CACHE`` on, the default);
- ``gptq-mapped``: the next load of the same files: the kernels' tensors mapped from the bundle;
- ``gptq-nocache``: ``LOADER_MARLIN_PACKED_CACHE=0``: packed from the words every load, nothing written;
- ``gptq-torch``: also ``LOADER_NATIVE_REPACK=0``: the torch conversion (every code unpacked to a byte, then
  packed), the path a machine without a C compiler takes;
- ``q4k-first``: the 1 GB-class random Llama as Q4_K (318 MB, ``gguf_checkpoints.ensure_gguf_llama``) kept
  packed (``quantization="gguf"``, ``dtype="float32"`` as ``bench_gguf_packed``'s ``packed``) with its bundles
  removed first: packed from the super-blocks by the compiled helpers and the bundle written;
- ``q4k-mapped``: the next load of the same file: the layers mapped from the bundle;
- ``q4k-nocache``: ``format_options={"packed_cache": False}``: packed every load, nothing written;
- ``q4k-torch``: also ``LOADER_NATIVE_REPACK=0`` (decoded and packed by torch operations);
- ``llama.cpp``: ``llama_cpp.Llama(path)`` (mmap, CPU) of the same Q4_K file from the pinned llama-cpp-python
  (``benchmarks/llamacpp_venv.py``), after loading the one-layer warm-up GGUF, as the loader processes.

Usage: ``OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_quant_repack.py [--reps 5] [--paths ...] [--cold]``.
Prints a Markdown table of medians and the ratios the acceptance names; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

OUT = REPO / "benchmarks" / "out"
CACHE = OUT / "cache-quant-repack"
"""The loader children's ``LOADER_CACHE_DIR`` (bundles and the compiled helpers)."""

_GPTQ = {"dtype": "bfloat16"}
_Q4K = {"quantization": "gguf", "dtype": "float32"}
PATHS: dict[str, tuple[str, dict[str, Any], dict[str, str], str | None]] = {
    # name: (checkpoint, load options, environment, bundle folder removed before the load)
    "bf16": ("bf16", {"dtype": "bfloat16"}, {}, None),
    "gptq-first": ("gptq", _GPTQ, {}, "marlin-packed"),
    "gptq-mapped": ("gptq", _GPTQ, {}, None),
    "gptq-nocache": ("gptq", _GPTQ, {"LOADER_MARLIN_PACKED_CACHE": "0"}, None),
    "gptq-torch": ("gptq", _GPTQ, {"LOADER_MARLIN_PACKED_CACHE": "0", "LOADER_NATIVE_REPACK": "0"}, None),
    "q4k-first": ("q4k", _Q4K, {}, "gguf-packed"),
    "q4k-mapped": ("q4k", _Q4K, {}, None),
    "q4k-nocache": ("q4k", {**_Q4K, "format_options": {"packed_cache": False}}, {}, None),
    "q4k-torch": ("q4k", {**_Q4K, "format_options": {"packed_cache": False}}, {"LOADER_NATIVE_REPACK": "0"}, None),
}
LLAMA_CPP = "llama.cpp"

_LOADER_CHILD = r"""
import gc, json, sys, time
import loader
path, options, warm = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
if warm:
    warm_up = loader.load_model(warm[0], **json.loads(warm[1]))
    del warm_up
gc.collect()
t0 = time.perf_counter()
model, report = loader.load_model_with_report(path, **options)
load_s = time.perf_counter() - t0
q = report.quantization or {}
print(json.dumps({"load_s": load_s, "packed_cache": q.get("packed_cache"), "packing": q.get("packing")}))
"""

_LLAMA_CPP_CHILD = r"""
import json, sys, time
import llama_cpp
path, warm = sys.argv[1], sys.argv[2:]
if warm:
    warm_up = llama_cpp.Llama(model_path=warm[0], n_threads=2, n_gpu_layers=0, n_ctx=64, use_mmap=True, verbose=False)
    del warm_up
t0 = time.perf_counter()
llm = llama_cpp.Llama(model_path=path, n_threads=2, n_gpu_layers=0, n_ctx=64, use_mmap=True, verbose=False)
print(json.dumps({"load_s": time.perf_counter() - t0}))
"""


def _child(command: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    full = {**os.environ, "TQDM_DISABLE": "1", "LOADER_CACHE_DIR": str(CACHE), **env}
    done = subprocess.run(command, capture_output=True, text=True, env=full, cwd=REPO, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _checkpoints(names: list[str]) -> dict[str, tuple[Path, Path]]:
    """Each checkpoint kind the paths need: (timed checkpoint, small warm-up checkpoint of the same kind)."""
    from benchmarks.bench_gptq_forward import ensure_gptq
    from benchmarks.checkpoints import ensure_checkpoint

    dense, _, _ = ensure_checkpoint(OUT, 1.0)
    small, _, _ = ensure_checkpoint(OUT, 0.05)
    found = {"bf16": (dense, small)}
    if any(name.startswith("gptq") for name in names):
        found["gptq"] = (ensure_gptq(dense, OUT / f"{dense.name}-gptq"), ensure_gptq(small, OUT / f"{small.name}-gptq"))
    if any(name.startswith("q4k") or name == LLAMA_CPP for name in names):
        sys.path.insert(0, str(REPO / "scripts"))
        from fetch_smollm2 import fetch_smollm2

        from benchmarks.gguf_checkpoints import ensure_gguf_llama, ensure_warm_up_gguf

        smollm2 = Path(fetch_smollm2())
        found["q4k"] = (ensure_gguf_llama(OUT, "Q4_K", smollm2), ensure_warm_up_gguf(OUT, smollm2))
    return found


def run_once(name: str, checkpoints: dict[str, tuple[Path, Path]], cold: bool, llamacpp: Path | None) -> dict[str, Any]:
    """One fresh process of path ``name``."""
    if name == LLAMA_CPP:
        path, warm = checkpoints["q4k"]
        assert llamacpp is not None
        return _child([str(llamacpp), "-c", _LLAMA_CPP_CHILD, str(path), *([] if cold else [str(warm)])], {}, name)
    kind, options, env, bundles = PATHS[name]
    path, warm = checkpoints[kind]
    if bundles is not None:
        shutil.rmtree(CACHE / bundles, ignore_errors=True)
    warm_args = [] if cold else [str(warm), json.dumps({k: v for k, v in options.items() if k != "format_options"})]
    return _child([sys.executable, "-c", _LOADER_CHILD, str(path), json.dumps(options), *warm_args], env, name)


def _ratio(table: dict[str, float], top: str, bottom: str) -> str:
    if top not in table or bottom not in table:
        return "—"
    return f"{table[top] / table[bottom]:.2f}x"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--paths", default=",".join([*PATHS, LLAMA_CPP]))
    parser.add_argument("--cold", action="store_true", help="no untimed warm-up load in each process")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.paths.split(",") if name.strip()]
    unknown = sorted(set(names) - {*PATHS, LLAMA_CPP})
    if unknown:
        parser.error(f"unknown paths {unknown}")
    from benchmarks.machine import describe_machine

    checkpoints = _checkpoints(names)
    llamacpp = None
    if LLAMA_CPP in names:
        from benchmarks.llamacpp_venv import llamacpp_python

        llamacpp = llamacpp_python()
    for path, _ in checkpoints.values():  # the page cache warm for every path
        for file in sorted(path.glob("*.safetensors")) if path.is_dir() else [path]:
            file.read_bytes()
    run_once("gptq-nocache" if "gptq" in checkpoints else "bf16", checkpoints, False, None)  # builds the helpers
    print("$ " + shlex.join(["OMP_NUM_THREADS=" + os.environ.get("OMP_NUM_THREADS", ""),
                             Path(sys.executable).name, *sys.argv]))
    print(f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {describe_machine()}, load average "
          f"{os.getloadavg()[0]:.2f} at start, {'cold' if args.cold else 'warm'} processes, medians of {args.reps}")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in (names if rep % 2 == 0 else list(reversed(names))):
            print(f"  rep {rep + 1}/{args.reps} {name} ...", file=sys.stderr, flush=True)
            runs[name].append(run_once(name, checkpoints, args.cold, llamacpp))
    table = {name: statistics.median(r["load_s"] for r in records) for name, records in runs.items()}
    print("\n| path | load s (median) | min | max | note |\n|---|---:|---:|---:|---|")
    for name, records in runs.items():
        times = [r["load_s"] for r in records]
        note = records[-1].get("packed_cache") or records[-1].get("packing") or ""
        if isinstance(note, dict):
            note = f"bundle hits {note['hits']}, misses {note['misses']}, written {note['written']}"
        print(f"| {name} | {table[name]:.3f} | {min(times):.3f} | {max(times):.3f} | {note} |")
    print(f"\nGPTQ first ÷ bf16 mapped: {_ratio(table, 'gptq-first', 'bf16')} (packing only: "
          f"{_ratio(table, 'gptq-nocache', 'bf16')}; torch conversion: {_ratio(table, 'gptq-torch', 'bf16')}); "
          f"GPTQ second (mapped bundle) ÷ bf16: {_ratio(table, 'gptq-mapped', 'bf16')}")
    print(f"Q4_K first ÷ llama.cpp: {_ratio(table, 'q4k-first', LLAMA_CPP)}, second (mapped bundle): "
          f"{_ratio(table, 'q4k-mapped', LLAMA_CPP)} (packing only: "
          f"{_ratio(table, 'q4k-nocache', LLAMA_CPP)}; torch: {_ratio(table, 'q4k-torch', LLAMA_CPP)})")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
