"""GGUF from a cold page cache: loader's read strategies against llama.cpp's load modes and ``dd`` with O_DIRECT.

The GGUF half of issue 32's item 2 (``bench_cold_cache.py`` holds the safetensors half and the page-cache
dropping). The file is the 318 MB 1 GB-class random Llama in Q4_K (``gguf_checkpoints.ensure_gguf_llama``).
Before every run the page cache is dropped (root only); each run is a fresh process whose imports happen
before the clock, and that first loads the one-layer warm-up GGUF and reads its pages (untimed, as a serving
process has its library initialised: dropping the page cache also drops libtorch's code, and the first run of
a kernel after it faults that code in from the disk, 17 ms for the strided sum that reads the pages). The clock
stops when every weight is in memory: for loader, after the load and a read of every page of every parameter
and buffer (the embedding and head stay mapped from the GGUF until used); for llama.cpp, after the load and
one decoded token (its mmap mode could leave pages to the first token; it reads them during the load, the
token adds ~0.01 s). Not a forward for loader: after the page cache is dropped, a first forward of the 1 GB
model also faults in libtorch's code for kernels the warm-up model did not run (0.35 s measured, none of it
weights). The load alone is reported too.

- ``dd O_DIRECT``: ``dd bs=8M iflag=direct`` over the GGUF file (the disk's rate for what llama.cpp reads), and
  over the GGUF file and the bundle (what the default load reads);
- ``loader, default``: ``load_model(path, quantization="gguf", dtype="float32")``: the linear layers mapped
  from the packed-weights bundle written by an earlier load (the bundle is cold too), the rest mapped from
  the GGUF file;
- ``loader, packing every load``: ``format_options={"packed_cache": False}``: every Q4_K layer read from the
  GGUF and packed;
- ``bundle alone, mapped`` / ``bundle alone, read into fresh memory``: not loads, the two ways of reading the
  packed-weights bundle a residency rule would choose between: mapped, populated and every page read, against
  ``pread`` in 8 MiB pieces into one fresh buffer;
- ``llama.cpp mmap`` / ``llama.cpp read`` / ``llama.cpp direct I/O``: ``llama_cpp.Llama`` with its load mode
  ``LLAMA_LOAD_MODE_MMAP`` (the default), ``NONE`` (read into buffers) and ``DIRECT_IO``, from the pinned
  llama-cpp-python (``benchmarks/llamacpp_venv.py``).

    python benchmarks/bench_cold_cache_gguf.py --reps 3 [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_cold_cache import DROP, dd_seconds, run_cold
from benchmarks.runner import json_child

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "benchmarks" / "out"
CACHE = OUT / "cache-cold-gguf"
"""The loader children's ``LOADER_CACHE_DIR``: the bundle the default load maps, kernel timings."""
TAG = "cold-cache-gguf"

_LOADER_CHILD = r"""
import json, sys, time
import loader
from benchmarks.measure import touch_pages
path, warm, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
touch_pages(loader.load_model(warm, quantization="gguf", dtype="float32"), buffers=True)  # torch's code read
began = time.perf_counter()
model = loader.load_model(path, **options)
loaded = time.perf_counter() - began
touch_pages(model, buffers=True)
print(json.dumps({"load_s": loaded, "seconds": time.perf_counter() - began}))
"""

_BUNDLE_CHILD = r"""
import json, mmap, os, sys, time
import torch
path, mode = sys.argv[1], sys.argv[2]
torch.zeros(1 << 16, dtype=torch.uint8)[::4096].sum()  # torch's code read before the clock
began = time.perf_counter()
if mode == "mapped":
    with open(path, "rb") as fh:
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    mapped.madvise(22)  # MADV_POPULATE_READ, as the loader's bundle reader does
    data = torch.frombuffer(mapped, dtype=torch.uint8)
else:
    data = torch.empty(os.path.getsize(path), dtype=torch.uint8)
    view, descriptor, done = memoryview(data.numpy()), os.open(path, os.O_RDONLY), 0
    while done < len(view):
        done += os.preadv(descriptor, [view[done:done + (8 << 20)]], done)
    os.close(descriptor)
loaded = time.perf_counter() - began
int(data[::4096].sum())
print(json.dumps({"load_s": loaded, "seconds": time.perf_counter() - began}))
"""

_LLAMA_CPP_CHILD = r"""
import json, sys, time
import llama_cpp
import llama_cpp.llama_cpp as api
path, warm, mode = sys.argv[1], sys.argv[2], sys.argv[3]
llama_cpp.Llama(model_path=warm, n_threads=2, n_gpu_layers=0, n_ctx=64, verbose=False)
if mode == "direct":  # the binding's constructor maps use_mmap=False to NONE; ask it for DIRECT_IO instead
    api.LLAMA_LOAD_MODE_NONE = api.LLAMA_LOAD_MODE_DIRECT_IO
began = time.perf_counter()
llm = llama_cpp.Llama(model_path=path, n_threads=2, n_gpu_layers=0, n_ctx=64, use_mmap=mode == "mmap",
                      verbose=False)
loaded = time.perf_counter() - began
llm.eval([1])
print(json.dumps({"load_s": loaded, "seconds": time.perf_counter() - began}))
"""


def _child(command: list[str]) -> dict[str, Any]:
    return json_child(command, {"TQDM_DISABLE": "1", "OMP_NUM_THREADS": "2", "LOADER_CACHE_DIR": str(CACHE)},
                      timeout=900)


def _dd(*paths: Path) -> dict[str, Any]:
    return {"seconds": dd_seconds(paths)}


def _bundle() -> Path:
    """The packed-weights bundle the default load maps (the untimed first load wrote it): the folder's largest,
    the one-layer warm-up model's is a few MB."""
    bundles = sorted((CACHE / "gguf-packed").glob("*.bin"), key=lambda p: p.stat().st_size)
    if not bundles:
        raise RuntimeError(f"no bundle in {CACHE / 'gguf-packed'}")
    return bundles[-1]


def _paths(path: Path, warm: Path, llamacpp: Path) -> dict[str, Callable[[], dict[str, Any]]]:
    def loader_path(options: dict[str, Any]) -> Callable[[], dict[str, Any]]:
        return lambda: _child([sys.executable, "-c", _LOADER_CHILD, str(path), str(warm), json.dumps(options)])

    def llamacpp_path(mode: str) -> Callable[[], dict[str, Any]]:
        return lambda: _child([str(llamacpp), "-c", _LLAMA_CPP_CHILD, str(path), str(warm), mode])

    gguf = {"quantization": "gguf", "dtype": "float32"}
    return {
        "dd O_DIRECT": lambda: _dd(path),
        "dd O_DIRECT, the GGUF and the bundle": lambda: _dd(path, _bundle()),
        "loader, default (bundle mapped)": loader_path(gguf),
        "loader, packing every load": loader_path({**gguf, "format_options": {"packed_cache": False}}),
        "bundle alone, mapped": lambda: _child([sys.executable, "-c", _BUNDLE_CHILD, str(_bundle()), "mapped"]),
        "bundle alone, read into fresh memory":
            lambda: _child([sys.executable, "-c", _BUNDLE_CHILD, str(_bundle()), "read"]),
        "llama.cpp mmap (default)": llamacpp_path("mmap"),
        "llama.cpp read": llamacpp_path("read"),
        "llama.cpp direct I/O": llamacpp_path("direct"),
    }


_NOT_LOADS = ("dd", "bundle alone")
"""Rows that read files but load no model: no ratio to the best load."""


def render(runs: dict[str, list[dict[str, Any]]], header: str, command: str) -> str:
    medians = {name: statistics.median(r["seconds"] for r in records) for name, records in runs.items()}
    floor = medians["dd O_DIRECT"]
    both = medians["dd O_DIRECT, the GGUF and the bundle"]
    best_name, best = min(((k, v) for k, v in medians.items() if not k.startswith(_NOT_LOADS)),
                          key=lambda item: item[1])
    lines = [header, "", "| path (cold page cache) | weights in memory, median s | runs (s) | load alone, median s "
             "| / dd O_DIRECT | / best |", "|---|---:|---|---:|---:|---:|"]
    for name, records in runs.items():
        loads = [r["load_s"] for r in records if "load_s" in r]
        each = ", ".join(f"{r['seconds']:.2f}" for r in records)
        lines.append(f"| {name} | {medians[name]:.3f} | {each} | "
                     f"{statistics.median(loads) if loads else float('nan'):.3f} | {medians[name] / floor:.2f} | "
                     + ("-" if name.startswith(_NOT_LOADS) else f"{medians[name] / best:.2f}") + " |")
    default = medians["loader, default (bundle mapped)"]
    lines += ["", f"Loader default / dd O_DIRECT over the files it reads (the GGUF and the bundle): "
              f"{default / both:.2f}; over the GGUF alone: {default / floor:.2f}; loader default / best "
              f"({best_name}): {default / best:.2f}.", "", f"Reproduce: `{command}`"]
    return "\n".join(lines).replace("| nan |", "| - |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md's section")
    args = parser.parse_args()
    if not os.access(DROP, os.W_OK):
        print(f"cannot drop the page cache ({DROP} is not writable: run as root); nothing measured", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO / "scripts"))
    from fetch_smollm2 import fetch_smollm2

    from benchmarks.gguf_checkpoints import ensure_gguf_llama, ensure_warm_up_gguf
    from benchmarks.llamacpp_venv import llamacpp_python
    from benchmarks.report import section_meta, show_section

    smollm2 = Path(fetch_smollm2())
    path, warm = ensure_gguf_llama(OUT, "Q4_K", smollm2), ensure_warm_up_gguf(OUT, smollm2)
    began = time.monotonic()
    meta = section_meta("bench_cold_cache_gguf.py", sys.argv[1:], path, args.reps, REPO)
    paths = _paths(path, warm, llamacpp_python())
    paths["loader, default (bundle mapped)"]()  # the bundle written, kernels timed: untimed
    runs = run_cold(paths, args.reps)
    header = "\n".join([
        "## GGUF from a cold page cache: loader against llama.cpp's load modes (issue 32, item 2)", "",
        f"- Date: {meta['date']}; {time.monotonic() - began:.0f} s",
        f"- Machine: {meta['machine']}",
        f"- Software: {meta['software']}, llama-cpp-python 0.3.36 (`benchmarks/llamacpp_venv.py`)",
        f"- Environment: {meta['environment']}",
        f"- `{meta['checkpoint']}` ({path.stat().st_size / 1e6:.0f} MB, Q4_K); {args.reps} repetitions, page cache "
        "dropped before each run, a fresh process per load (imports and a one-layer warm-up load before the "
        "clock; the clock stops when every weight is in memory)",
    ])
    table = render(runs, header, meta["command"])
    show_section(table, args.results, TAG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
