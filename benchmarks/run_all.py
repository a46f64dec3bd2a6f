"""Every load benchmark in one command (``make bench``); results go to ``benchmarks/RESULTS.md``.

For each checkpoint size (generated once, cached under ``benchmarks/out/``):
``loader.load_model``, ``transformers.from_pretrained``, the vLLM-style loop
and the page-cache floor, each in a fresh process, the order rotating between
repetitions, the page cache warmed before each; on the smallest size also
loader at tp=2 under torchrun (bytes read per rank) and, once
``loader save-sharded`` exists, the sharded state at tp=2. Then
``bench_read_paths.py`` in its own process. Writes the Markdown page, a PNG
of seconds per path next to it, and the raw records to ``out/last-run.json``.

Quick check (well under a minute): ``python benchmarks/run_all.py --sizes 0.1 --reps 1
--warmup 0 --read-paths-gb 0.1 --results benchmarks/out/RESULTS-quick.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import (
    ensure_checkpoint,
    ensure_tiny_checkpoint,
    shard_files,
    tensor_specs,
    warm_page_cache,
)
from benchmarks.host_memory import warm_host_memory
from benchmarks.machine import describe_environment, describe_machine, describe_software
from benchmarks.paths import PATHS, MeasuredPath, PathSkipped
from benchmarks.plot import MATPLOTLIB_HINT, have_matplotlib, plot_seconds
from benchmarks.report import carried_block, carried_notes, render_markdown, summarize
from benchmarks.runner import REPO_ROOT, child_env, run_path

BENCH_DIR = Path(__file__).resolve().parent
READ_PATHS = "read_paths"
SINGLE_PROCESS = ("loader", "loader_copy", "transformers", "vllm_loop", "floor")
TP_PATHS = ("loader_tp2", "sharded_tp2")
CARRIED_BLOCKS = ("fallback", "bin", "moe", "update", "quantized-formats", "quant-repack", "kernel-paths",
                  "kernel-paths-smollm2", "tensorizer",
                  "huge-pages", "converting-reads", "cold-cache", "cold-cache-gguf")
"""Sections of RESULTS.md written by the single-purpose benchmarks, kept across runs."""


def _sizes(text: str) -> list[float]:
    try:
        sizes = sorted({float(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes takes GB numbers separated by commas, found {text!r}") from None
    if not sizes or any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"--sizes needs positive sizes in GB, found {text!r}")
    return sizes


def _only(text: str) -> list[str]:
    known = [*PATHS, READ_PATHS]
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"--only takes some of {', '.join(known)}; unknown: {unknown or text!r}")
    return names


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sizes", type=_sizes, default=[1.0, 4.0],
                        help="checkpoint sizes in GB, comma-separated (default 1,4); tp=2 runs on the smallest")
    parser.add_argument("--reps", type=int, default=None,
                        help="repetitions per path (default 5 up to 1 GB, 3 above; 5 for read_paths)")
    parser.add_argument("--only", type=_only, default=None,
                        help=f"comma-separated subset of: {', '.join([*PATHS, READ_PATHS])}")
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out",
                        help="cache of generated checkpoints and raw results (default benchmarks/out)")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md",
                        help="Markdown page to write (default benchmarks/RESULTS.md); the PNG goes next to it")
    parser.add_argument("--warmup", type=int, default=1,
                        help="untimed runs of each path before the timed ones (default 1): they fill the "
                             "bytecode cache and loader's registry cache")
    parser.add_argument("--no-warm-memory", action="store_true",
                        help="skip the untimed pass over free memory (see benchmarks/host_memory.py)")
    parser.add_argument("--warm-process", action="store_true",
                        help="each child first loads a tiny same-architecture checkpoint, untimed, so lazy "
                             "imports inside a load are not timed (a server's second load); default: cold process")
    parser.add_argument("--read-paths-gb", type=float, default=1.0, help="file size for bench_read_paths (GB)")
    parser.add_argument("--timeout-per-gb", type=float, default=240.0,
                        help="child time limit per GB of checkpoint, plus 120 s (default 240)")
    return parser.parse_args(argv)


def _command_line(argv: list[str] | None) -> str:
    python = Path(sys.executable)
    try:
        shown = str(python.relative_to(REPO_ROOT))
    except ValueError:
        shown = "python"
    args = sys.argv[1:] if argv is None else argv
    return shlex.join([shown, "benchmarks/run_all.py", *args])


def _log(message: str) -> None:
    print(message, flush=True)


def _prepare(path: MeasuredPath, checkpoint: Path, out_dir: Path) -> tuple[Path | None, str | None, str | None]:
    """``(source, skipped note, error)`` for one path on one checkpoint."""
    if path.prepare is None:
        return checkpoint, None, None
    try:
        return path.prepare(checkpoint, out_dir), None, None
    except PathSkipped as exc:
        return None, str(exc), None
    except Exception as exc:
        return None, None, f"preparing failed: {type(exc).__name__}: {exc}"


def run_size(gigabytes: float, names: list[str], reps: int, args: argparse.Namespace) -> dict[str, Any]:
    """Generate (or reuse) one checkpoint and time the chosen paths on it, alternating."""
    started = time.perf_counter()
    folder, shape, generated = ensure_checkpoint(args.out_dir, gigabytes)
    if generated:
        _log(f"[{gigabytes:g} GB] wrote {folder} in {time.perf_counter() - started:.0f} s (cached for reruns)")
    files = shard_files(folder)
    largest = max(math.prod(dims) for _, dims in tensor_specs(shape)) * 2
    sources: dict[str, Path] = {}
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in names}
    skipped: dict[str, str] = {}
    for name in names:
        source, note, error = _prepare(PATHS[name], folder, args.out_dir)
        if source is not None:
            sources[name] = source
        elif note is not None:
            skipped[name] = note
            _log(f"[{gigabytes:g} GB] {name}: skipped: {note}")
        else:
            runs[name].append([{"path": name, "rank": 0, "ok": False, "stage": "prepare", "error": error}])
            _log(f"[{gigabytes:g} GB] {name}: {error}")
    warm_files = sorted({*files, *(f for s in sources.values() if s != folder for f in s.glob("*.safetensors"))})
    timeout = 120 + args.timeout_per_gb * gigabytes
    pycache = args.out_dir / "pycache"
    warm = ensure_tiny_checkpoint(args.out_dir) if args.warm_process else None
    order = list(sources)
    for rep in range(args.warmup):
        for name in order:
            records = run_path(PATHS[name], sources[name], timeout, pycache, warm)
            ok = all(r.get("ok") for r in records)
            _log(f"[{gigabytes:g} GB] warm-up {rep + 1}/{args.warmup} {name}: {'ok' if ok else 'FAILED'} (discarded)")
    for rep in range(reps):
        rotated = order[rep % len(order):] + order[:rep % len(order)] if order else []
        for name in rotated:
            warm_page_cache(warm_files)
            records = run_path(PATHS[name], sources[name], timeout, pycache, warm)
            runs[name].append(records)
            shown = ", ".join(f"{r['load_seconds']:.3f} s" if r.get("ok") else f"FAILED ({r.get('error')})"
                              for r in records)
            _log(f"[{gigabytes:g} GB] rep {rep + 1}/{reps} {name}: {shown}")
    summaries = {name: summarize(name, PATHS[name].label, runs[name], skipped.get(name)) for name in names}
    return {"gigabytes": gigabytes, "folder": str(folder.relative_to(REPO_ROOT)) if folder.is_relative_to(REPO_ROOT)
            else str(folder), "shape": shape.__dict__, "parameter_bytes": shape.parameter_bytes,
            "largest_tensor_bytes": largest, "files": len(files), "reps": reps, "warmup": args.warmup,
            "warm_process": args.warm_process, "runs": runs,
            "skipped": skipped, "summaries": summaries}


def run_read_paths(args: argparse.Namespace) -> dict[str, Any]:
    """``bench_read_paths.py`` in its own process; its JSON, or a failure record."""
    reps = args.reps if args.reps is not None else 5
    with tempfile.TemporaryDirectory(prefix="bench-read-paths-") as tmp:
        out = Path(tmp) / "read_paths.json"
        command = [sys.executable, str(BENCH_DIR / "bench_read_paths.py"), "--size-gb", f"{args.read_paths_gb:g}",
                   "--reps", str(reps), "--out-dir", str(args.out_dir), "--json", str(out)]
        try:
            done = subprocess.run(command, cwd=REPO_ROOT, env=child_env(args.out_dir / "pycache"),
                                  capture_output=True, text=True, timeout=600 + 240 * args.read_paths_gb)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": "timed out"}
        if out.is_file():
            result: dict[str, Any] = json.loads(out.read_text())
            _log(done.stdout.rstrip())
            return result
        return {"ok": False, "error": f"exit status {done.returncode}: {done.stderr.strip()[-500:]}"}


def _raw(results: dict[str, Any]) -> dict[str, Any]:
    sizes = [{k: v for k, v in size.items() if k != "summaries"} for size in results["sizes"]]
    return {**results, "sizes": sizes}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    selected = args.only or [*PATHS, READ_PATHS]
    can_plot = have_matplotlib()
    if not can_plot:
        _log(MATPLOTLIB_HINT)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": describe_machine(),
            "software": describe_software(REPO_ROOT), "environment": describe_environment(),
            "command": _command_line(argv),
            "process": "warm (a tiny checkpoint loaded first, untimed)" if args.warm_process else "cold (fresh)"}
    _log(f"{meta['machine']}\n{meta['environment']}")
    if not args.no_warm_memory:
        meta["host_memory"] = warm_host_memory()
        _log(f"host memory: {meta['host_memory']}")
    results: dict[str, Any] = {"meta": meta, "sizes": [], "read_paths": None, "plot": None}
    for gigabytes in args.sizes:
        names = [n for n in selected if n in SINGLE_PROCESS or (n in TP_PATHS and gigabytes == args.sizes[0])]
        if not names:
            continue
        reps = args.reps if args.reps is not None else (5 if gigabytes <= 1.0 else 3)
        results["sizes"].append(run_size(gigabytes, names, max(1, reps), args))
    if READ_PATHS in selected:
        results["read_paths"] = run_read_paths(args)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    plot_file = args.results.with_suffix(".png")
    if can_plot and results["sizes"]:
        plot_seconds(results["sizes"], plot_file)
        results["plot"] = plot_file.name
    existing = args.results.read_text() if args.results.is_file() else None
    # sections other benchmarks wrote (bench_fallback.py, bench_bin_read.py) are kept as they are
    carried = {tag: block for tag in CARRIED_BLOCKS if (block := carried_block(existing, tag))}
    args.results.write_text(render_markdown(results, carried_notes(existing), carried or None))
    (args.out_dir / "last-run.json").write_text(json.dumps(_raw(results), indent=2, default=str) + "\n")
    _log(f"wrote {args.results}" + (f" and {plot_file}" if results["plot"] else ""))
    failed = [s.name for size in results["sizes"] for s in size["summaries"].values() if s.status == "failed"]
    if results["read_paths"] is not None and not results["read_paths"].get("ok"):
        failed.append(READ_PATHS)
    if failed:
        _log(f"failed: {', '.join(failed)} (see {args.results})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
