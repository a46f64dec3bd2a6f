"""Huge pages for fresh memory: CPU loads that copy (not map) with ``LOADER_HUGE_PAGES=1`` against ``=0``.

Each load runs in a fresh process after the machine sat idle ``--idle`` seconds (so memory freed by the previous
process has been reported to the host, as before a real start), the two settings alternating; medians. Paths,
on the 1 GB benchmark Llama (bf16): a bf16 → float32 load (every byte converted into fresh memory), a bf16 load
with ``LOADER_MAP_WEIGHTS=0`` (every byte copied into fresh memory), and the same model written by tensorizer
(unaligned tensors: most bytes copied). A raw row writes 1 GiB of fresh anonymous memory with torch, advised or
not, to show the fault cost alone. Also prints whether this machine's virtio balloon reports free pages (the
rule ``loader.io.advise_fresh_huge_pages`` follows when the variable is unset).

``python benchmarks/bench_huge_pages.py --reps 3 --idle 5`` (needs ``bench_tensorizer.py`` run once for the
tensorizer file). The section goes between the ``<!-- huge-pages -->`` markers of ``benchmarks/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, warm_page_cache
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT

OUT = Path(__file__).resolve().parent / "out"
TAG = "huge-pages"

_LOAD = r"""
import sys, time
import loader
from benchmarks.measure import touch_pages
start = time.perf_counter()
model = loader.load_model(sys.argv[1], dtype=sys.argv[2])
touch_pages(model)
print(time.perf_counter() - start)
"""

_FILL = r"""
import mmap, sys, time
import torch
from loader.io import advise_fresh_huge_pages
size, huge = 1 << 30, 2 << 20
buffer = mmap.mmap(-1, size + 2 * huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
whole = torch.frombuffer(buffer, dtype=torch.uint8)
skip = -whole.data_ptr() % huge
if advise_fresh_huge_pages():
    buffer.madvise(mmap.MADV_HUGEPAGE, skip, size)
target, source = whole[skip:skip + size], torch.ones(16 << 20, dtype=torch.uint8)
start = time.perf_counter()
for at in range(0, size, 16 << 20):
    target[at:at + (16 << 20)].copy_(source)
print(time.perf_counter() - start)
"""


def _cases(folder: Path) -> dict[str, tuple[str, list[str], dict[str, str]]]:
    tensorized = folder.parent / f"{folder.name}-tensorizer" / "model.tensors"
    cases = {"1 GiB of fresh memory written by torch (no load)": (_FILL, [], {}),
             "bf16 → float32 load (safetensors)": (_LOAD, [str(folder), "float32"], {}),
             "bf16 load copied (`LOADER_MAP_WEIGHTS=0`)": (_LOAD, [str(folder), "bfloat16"],
                                                            {"LOADER_MAP_WEIGHTS": "0"})}
    if tensorized.is_file():
        cases["bf16 load of the tensorizer file"] = (_LOAD, [str(tensorized), "bfloat16"], {})
    return cases


def measure(folder: Path, reps: int, idle: float) -> dict[str, dict[str, list[float]]]:
    """Seconds per case and setting (``"1"``/``"0"``), each run after ``idle`` seconds of nothing."""
    results: dict[str, dict[str, list[float]]] = {}
    for label, (code, args, extra) in _cases(folder).items():
        results[label] = {"1": [], "0": []}
        files = [p for p in [Path(args[0])] if p.is_file()] or sorted(Path(args[0]).glob("*.safetensors")) \
            if args else []
        for rep in range(reps):
            for setting in ("1", "0") if rep % 2 == 0 else ("0", "1"):
                if files:
                    warm_page_cache(files)
                time.sleep(idle)
                env = {**os.environ, **extra, "LOADER_HUGE_PAGES": setting, "PYTHONPATH": str(REPO_ROOT)}
                done = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=REPO_ROOT,
                                      capture_output=True, text=True, check=True)
                results[label][setting].append(float(done.stdout.strip().splitlines()[-1]))
                print(f"{label} LOADER_HUGE_PAGES={setting}: {results[label][setting][-1]:.3f} s", flush=True)
    return results


def render(meta: dict[str, str], results: dict[str, dict[str, list[float]]], reporting: bool,
           idle: float) -> str:
    lines = ["## Huge pages for fresh memory", "",
             f"- Date: {meta['date']}", f"- Machine: {meta['machine']}; virtio balloon free page reporting: "
             f"{'yes' if reporting else 'no'} (so `LOADER_HUGE_PAGES` unset means "
             f"{'no' if reporting else 'yes'})", f"- Software: {meta['software']}",
             f"- Environment: {meta['environment']}", f"- Command: `{meta['command']}`", "",
             f"Each run a fresh process after {idle:g} s idle, the two settings alternating, {meta['reps']} runs "
             "each; loads timed until every parameter page was touched (the checkpoint read once before the idle "
             "gap, so mostly in the page cache; the host may take some of it back while idle).", "",
             "| path | huge pages (s) | 4 KiB pages (s) | 4 KiB ÷ huge |", "|---|---|---|---:|"]
    for label, by in results.items():
        on, off = statistics.median(by["1"]), statistics.median(by["0"])
        lines.append(f"| {label} | {on:.3f} ({', '.join(f'{v:.2f}' for v in by['1'])}) | {off:.3f} "
                     f"({', '.join(f'{v:.2f}' for v in by['0'])}) | {off / on:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of nothing before each run")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "RESULTS.md")
    args = parser.parse_args(argv)
    from loader._huge_pages import balloon_reports_free_pages

    folder, _, _ = ensure_checkpoint(OUT, args.gb)
    results = measure(folder, max(1, args.reps), args.idle)
    meta = section_meta("bench_huge_pages.py", argv if argv is not None else sys.argv[1:], folder, args.reps,
                        REPO_ROOT)
    section = render(meta, results, balloon_reports_free_pages(), args.idle)
    write_section(args.results, TAG, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
