"""Loads from a cold page cache: which read strategy is fastest, against ``dd`` with O_DIRECT (issue 32, item 2).

Before every cold run the page cache is dropped (``echo 3 > /proc/sys/vm/drop_caches``: root only; the
benchmark says so and stops otherwise). Each run is a fresh process whose imports (torch, numpy, the plugins a
safetensors Llama load uses) happen before the clock; the clock stops when every parameter page is present
(mapped ones touched). Paths alternate in order between repetitions; medians. The checkpoint is
``benchmarks/out/llama-1gb`` (0.98 GB bf16, 5 shards):

- ``dd O_DIRECT``: ``dd bs=8M iflag=direct`` over the shards (the disk's sequential rate, no page cache);
- ``dd buffered``: the same through the page cache;
- ``loader, mapped`` (the default): parameters mapped from the page cache, populated on the I/O pool;
- ``loader, WILLNEED then mapped``: ``posix_fadvise(WILLNEED)`` on every shard first (the kernel reads ahead
  asynchronously in large requests), then the default load: the strategy a cold file would switch to;
- ``loader, copying`` (``LOADER_MAP_WEIGHTS=0``): positioned reads into fresh parameter memory;
- ``loader, Run:ai streamer`` (``load_format="runai_streamer"``), when the plugin is installed;
- ``safetensors.torch.load_file``: the safetensors library's own load (its tensors touched like the others).

A warm run of the default load (page cache filled by the previous cold run) is the reference for what the cache
saves. GGUF with llama.cpp is not measured here (its binding is a 15-30 minute build:
``benchmarks/llamacpp_venv.py``).

    python benchmarks/bench_cold_cache.py --reps 3 [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
TAG = "cold-cache"
CHECKPOINT = REPO / "benchmarks" / "out" / "llama-1gb"
DROP = Path("/proc/sys/vm/drop_caches")


def _shards() -> list[Path]:
    return sorted(CHECKPOINT.glob("*.safetensors"))


def drop_caches() -> None:
    os.sync()
    DROP.write_text("3\n")
    time.sleep(0.3)  # let the writeback of the drop settle before the clock


def _child(kind: str) -> dict[str, Any]:
    """One fresh process: imports first, then the timed load of ``kind``."""
    import numpy  # noqa: F401
    import torch

    import loader
    import loader_plugin_llama  # noqa: F401
    import loader_plugin_safetensors  # noqa: F401
    from benchmarks.measure import touch_pages

    touch_pages(torch.nn.Linear(64, 64))  # the page-reading kernel's code faulted in before the clock
    began = time.perf_counter()
    if kind == "safetensors":
        from safetensors.torch import load_file

        holder = torch.nn.Module()  # so touch_pages reads one byte of every page, as for the loads
        for index, path in enumerate(_shards()):
            for name, tensor in load_file(str(path)).items():
                holder.register_parameter(f"{index}_{name.replace('.', '_')}",
                                          torch.nn.Parameter(tensor, requires_grad=False))
        touch_pages(holder)  # load_file's tensors may be backed by a map of the file, read on first touch
        return {"seconds": time.perf_counter() - began,
                "bytes": sum(p.numel() * p.element_size() for p in holder.parameters())}
    if kind == "willneed":
        for path in _shards():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
    load_format = "runai_streamer" if kind == "runai" else "auto"
    model = loader.load_model(str(CHECKPOINT), dtype=torch.bfloat16, load_format=load_format)
    touch_pages(model)
    return {"seconds": time.perf_counter() - began,
            "bytes": sum(p.numel() * p.element_size() for p in model.parameters())}


T = TypeVar("T")


def run_cold(paths: Mapping[str, Callable[[], T]], reps: int,
             after_each_round: Callable[[], object] | None = None) -> dict[str, list[T]]:
    """Every path ``reps`` times, each run after the page cache is dropped, the order reversed every other round
    (and ``after_each_round`` called after each); each path's results in order."""
    results: dict[str, list[T]] = {name: [] for name in paths}
    for rep in range(reps):
        order = list(paths.items())
        for name, run in order if rep % 2 == 0 else order[::-1]:
            drop_caches()
            results[name].append(run())
            print(f"{name}: {results[name][-1]}", file=sys.stderr, flush=True)
        if after_each_round is not None:
            after_each_round()
    return results


def _run_child(kind: str, env: dict[str, str]) -> float:
    from benchmarks.runner import json_child

    return float(json_child([sys.executable, __file__, "--child", kind], env)["seconds"])


def dd_seconds(paths: Iterable[Path], direct: bool = True) -> float:
    """Seconds ``dd bs=8M`` takes to read ``paths`` one after another (with ``iflag=direct``: the disk's
    sequential rate, no page cache)."""
    began = time.perf_counter()
    for path in paths:
        subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=8M", *(["iflag=direct"] if direct else [])],
                       check=True, capture_output=True)
    return time.perf_counter() - began


def _paths(with_runai: bool) -> dict[str, Callable[[], float]]:
    paths: dict[str, Callable[[], float]] = {
        "dd O_DIRECT": lambda: dd_seconds(_shards()),
        "dd buffered": lambda: dd_seconds(_shards(), direct=False),
        "loader, mapped (default)": lambda: _run_child("loader", {}),
        "loader, WILLNEED then mapped": lambda: _run_child("willneed", {}),
        "loader, copying (LOADER_MAP_WEIGHTS=0)": lambda: _run_child("loader", {"LOADER_MAP_WEIGHTS": "0"}),
        "safetensors.torch.load_file": lambda: _run_child("safetensors", {}),
    }
    if with_runai:
        paths["loader, Run:ai streamer"] = lambda: _run_child("runai", {})
    return paths


def render(times: dict[str, list[float]], warm: list[float], header: str, command: str) -> str:
    floor = statistics.median(times["dd O_DIRECT"])
    default = statistics.median(times["loader, mapped (default)"])
    best = min((statistics.median(v), k) for k, v in times.items() if not k.startswith("dd"))
    lines = [header, "", "| path (cold page cache) | median s | runs (s) | / dd O_DIRECT | / best load |",
             "|---|---:|---|---:|---:|"]
    for name, runs in times.items():
        median = statistics.median(runs)
        lines.append(f"| {name} | {median:.3f} | {', '.join(f'{r:.2f}' for r in runs)} | {median / floor:.2f} | "
                     + ("-" if name.startswith("dd") else f"{median / best[0]:.2f}") + " |")
    lines += [f"| warm page cache: loader, mapped (default) | {statistics.median(warm):.3f} | "
              f"{', '.join(f'{r:.2f}' for r in warm)} | - | - |", "",
              f"Default (mapped) / dd O_DIRECT: {default / floor:.2f}; default / best load ({best[1]}): "
              f"{default / best[0]:.2f}.", "", f"Reproduce: `{command}`"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--results", type=Path, help="write the table into this RESULTS.md's cold-cache section")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child)))
        return 0
    if not os.access(DROP, os.W_OK):
        print(f"cannot drop the page cache ({DROP} is not writable: run as root); nothing measured", file=sys.stderr)
        return 2
    try:
        import loader_plugin_runai  # noqa: F401
        with_runai = True
    except ImportError:
        with_runai = False
    from benchmarks.report import section_meta, show_section

    began = time.monotonic()
    meta = section_meta("bench_cold_cache.py", sys.argv[1:], CHECKPOINT, args.reps, REPO)
    paths = _paths(with_runai)
    warm: list[float] = []
    _run_child("loader", {})  # bytecode written, plugins' first-use work done: untimed
    times = run_cold(paths, args.reps, after_each_round=lambda: warm.append(_run_child("loader", {})))
    header = "\n".join([
        "## Loads from a cold page cache against dd with O_DIRECT (issue 32, item 2)", "",
        f"- Date: {meta['date']}; {time.monotonic() - began:.0f} s",
        f"- Machine: {meta['machine']}",
        f"- Software: {meta['software']}",
        f"- Environment: {meta['environment']}",
        f"- `{meta['checkpoint']}` (0.98 GB bf16, 5 shards); {args.reps} repetitions, page cache dropped "
        "before each run, a fresh process per load (imports before the clock; the clock stops with every "
        "parameter page present)",
    ])
    command = meta["command"]
    table = render(times, warm, header, command)
    show_section(table, args.results, TAG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
