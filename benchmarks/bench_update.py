"""Live weight updates against a fresh load, ``load_state_dict`` and a plain copy, on the 1 GB benchmark Llama.

``python benchmarks/bench_update.py [--reps 5] [--size-gb 1]`` measures, each in a fresh process under the rules
of ``run_all.py`` (warm page cache, one untimed warm-up round, the order of paths rotating every round, medians):

- ``update``: ``loader.update_weights`` from a state dict already in memory (read before the clock starts);
- ``reload``: ``loader.reload_weights`` from the checkpoint on disk;
- ``load``: a fresh ``loader.load_model`` of the same checkpoint;
- ``load_state_dict``: torch's ``model.load_state_dict`` of the model's own tensors (same bytes, no mapping);
- ``memcpy``: ``param.copy_`` of every parameter from a copy of it: the floor for writing those bytes.

The update also reports its peak extra resident memory (``VmHWM`` reset before it, minus ``VmRSS`` before it).
The section goes to ``benchmarks/RESULTS.md`` between ``<!-- update -->`` markers, which ``run_all.py`` carries.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files, warm_page_cache
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT, child_env

BENCH_DIR = Path(__file__).resolve().parent
PATHS = ("update", "reload", "load", "load_state_dict", "memcpy")
TAG = "update"
TARGET = 1.5
"""The issue's target: an update within this many times a copy of the bytes it writes."""


def _status_bytes(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    """Make ``VmHWM`` start again from ``VmRSS`` (Linux: ``clear_refs`` 5); a no-op where refused."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
    except OSError:
        pass


def _child(path: str, folder: Path) -> dict[str, Any]:
    """One measurement of ``path`` in this (fresh) process."""
    import torch
    from safetensors.torch import load_file

    import loader

    if path == "load":
        start = time.perf_counter()
        loader.load_model(str(folder), dtype="bfloat16")
        return {"seconds": time.perf_counter() - start}
    model = loader.load_model(str(folder), dtype="bfloat16")
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if path == "update":
        state: dict[str, torch.Tensor] = {}
        for file in shard_files(folder):
            state.update(load_file(str(file)))
        before = _status_bytes("VmRSS")
        _reset_peak()
        start = time.perf_counter()
        loader.update_weights(model, state)
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "bytes": nbytes, "extra_rss": _status_bytes("VmHWM") - before}
    if path == "reload":
        start = time.perf_counter()
        loader.reload_weights(model)
        return {"seconds": time.perf_counter() - start, "bytes": nbytes}
    if path == "load_state_dict":
        copies = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        start = time.perf_counter()
        model.load_state_dict(copies)
        return {"seconds": time.perf_counter() - start, "bytes": nbytes}
    sources = [(param, param.detach().clone()) for param in model.parameters()]
    start = time.perf_counter()
    with torch.no_grad():
        for param, source in sources:
            param.copy_(source)
    return {"seconds": time.perf_counter() - start, "bytes": nbytes}


def _run_child(path: str, folder: Path, out: Path) -> dict[str, Any]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", path, "--folder", str(folder),
               "--child-out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, env=child_env(BENCH_DIR / "out" / "pycache"),
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not out.is_file():
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no result"]}
    return json.loads(out.read_text())  # type: ignore[no-any-return]


def measure(folder: Path, reps: int, out_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every path ``reps`` times after one warm-up round, the order rotating by one each round."""
    records: dict[str, list[dict[str, Any]]] = {path: [] for path in PATHS}
    for round_ in range(reps + 1):
        order = PATHS[round_ % len(PATHS):] + PATHS[:round_ % len(PATHS)]
        for path in order:
            warm_page_cache(shard_files(folder))
            record = _run_child(path, folder, out_dir / f"update-{path}.json")
            if round_ > 0:
                records[path].append(record)
    return records


def _median(records: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in records if key in r]
    return statistics.median(values) if values else None


def render(records: dict[str, list[dict[str, Any]]], meta: dict[str, str]) -> str:
    """The Markdown section (without its markers)."""
    lines = ["## Live weight updates (issue 31)", "",
             f"- Date: {meta['date']}", f"- Machine: {meta['machine']}", f"- Software: {meta['software']}",
             f"- Environment: {meta['environment']}", f"- Command: `{meta['command']}`", "",
             f"`{meta['checkpoint']}`, bf16, {meta['reps']} repetitions per path, each in a fresh process "
             "(warm page cache, one warm-up round, order rotating).", "",
             "| path | median s | vs memcpy | vs fresh load | failures |", "|---|---:|---:|---:|---|"]
    copy, load = _median(records["memcpy"], "seconds"), _median(records["load"], "seconds")
    for path in PATHS:
        med = _median(records[path], "seconds")
        errors = [r["error"] for r in records[path] if "error" in r]
        ratio_copy = f"{med / copy:.2f}x" if med and copy else "—"
        ratio_load = f"{med / load:.2f}x" if med and load else "—"
        lines.append(f"| {path} | {med:.3f} | {ratio_copy} | {ratio_load} | {len(errors) or ''} |" if med else
                     f"| {path} | — | — | — | {errors[:1]} |")
    extra = _median(records["update"], "extra_rss")
    update = _median(records["update"], "seconds")
    if extra is not None:
        lines += ["", f"Peak extra RSS of an update (beyond the model and the state dict): {extra / 2**20:,.0f} MiB."]
    if update and copy:
        verdict = "pass" if update <= TARGET * copy else "**fail**"
        lines += ["", f"Target, an update within {TARGET}x a memcpy of the bytes it writes: "
                      f"{update / copy:.2f}x, {verdict}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    parser.add_argument("--child", choices=PATHS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.child_out.write_text(json.dumps(_child(args.child, args.folder)))
        return 0
    args.out_dir.mkdir(parents=True, exist_ok=True)
    folder, _, _ = ensure_checkpoint(args.out_dir, args.size_gb)
    meta = section_meta("bench_update.py", argv if argv is not None else sys.argv[1:], folder, args.reps, REPO_ROOT)
    section = render(measure(folder, max(1, args.reps), args.out_dir), meta)
    write_section(args.results, TAG, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
