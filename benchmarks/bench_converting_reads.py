"""Converting and row-gathering reads against the memcpy floor of the bytes they write (issue 32, item 3).

Two reads copy rather than map: a bfloat16 checkpoint loaded as float32 (every byte widened), and a
row-parallel shard under tensor parallelism (each row's half for one rank). Both must stay off memory maps of
the checkpoint (a file truncated mid-load is a ``SIGBUS`` there), so they read with ``pread``: before, into a
bounce buffer that torch or numpy copied again (``LOADER_FUSED_READS=0``); now in one compiled pass
(``loader.io.read_widening`` / ``gather_rows``). The floor is a ``memcpy`` of the bytes the read writes, from
memory already in the cache hierarchy's reach, into the same kind of destination.

Part 1, reads (one process, the same warm ``--size-mb`` file and pre-faulted destination, paths alternating,
medians of ``--reps``): the floor, the old map (not fault-safe: a reference), the bounce buffer, the fused read.

Part 2, loads (a fresh process per run, paths alternating, medians): the 1 GB bf16 Llama
(``benchmarks/out/llama-1gb``) loaded as float32, and rank 0 of tp=2 (a simulated rank: the same reads as under
torchrun), fused and bounced, against a fresh process that copies the same number of parameter bytes into fresh
memory (the floor: a load writes fresh memory too). The clock runs from after the imports until every parameter
page is present (mapped ones are touched).

    python benchmarks/bench_converting_reads.py --reps 7 --load-reps 5 [--results benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

REPO = Path(__file__).resolve().parent.parent
TAG = "converting-reads"
CHECKPOINT = REPO / "benchmarks" / "out" / "llama-1gb"


def _time(run: Callable[[], None]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def _reads(size_mb: int, reps: int) -> list[dict[str, Any]]:
    """Part 1: per read, seconds of each path (medians), same process, alternating."""
    import torch
    from safetensors.torch import save_file

    from benchmarks.bench_fault_safe_reads import old_copy_through_map, old_gather_from_map
    from loader_plugin_safetensors import open_checkpoint_file
    from loader_plugin_safetensors.parallel_read import read_layout

    cols = 4096  # 8 KiB rows of bf16; the tp=2 narrow keeps 4 KiB of each
    rows = size_mb * (1 << 20) // (cols * 2)
    out: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="converting-reads-") as tmp:
        path = Path(tmp) / "w.safetensors"
        save_file({"w": torch.randn(rows, cols).bfloat16()}, str(path))
        path.read_bytes()  # warm the page cache
        whole = open_checkpoint_file(path).tensor("w")
        half = whole.narrow(1, 0, cols // 2)
        converted = torch.ones(rows, cols, dtype=torch.float32)  # pre-faulted destinations
        gathered = torch.ones(rows, cols // 2, dtype=torch.bfloat16)
        gathered_np = gathered.view(-1).view(torch.uint8).numpy()
        converted_source = torch.ones(rows, cols, dtype=torch.float32)  # what a memcpy of the written bytes reads
        gathered_source = torch.ones(rows, cols // 2, dtype=torch.bfloat16)
        fd = os.open(path, os.O_RDONLY)

        def fused(on: bool, run: Callable[[], None]) -> Callable[[], None]:
            def call() -> None:
                os.environ["LOADER_FUSED_READS"] = "1" if on else "0"
                run()
            return call

        convert = lambda: whole.read_into(converted)  # noqa: E731
        gather = lambda: read_layout(fd, half.layout(), gathered_np, path=str(path), what="w")  # noqa: E731
        cases = {
            ("convert bf16 -> float32", converted.numel() * 4): {
                "memcpy floor": lambda: converted.copy_(converted_source),
                "map (not fault-safe)": lambda: old_copy_through_map(fd, whole, converted),
                "bounce buffer": fused(False, convert), "fused": fused(True, convert)},
            ("tp=2 row-parallel gather (4 KiB of 8 KiB rows)", gathered.numel() * 2): {
                "memcpy floor": lambda: gathered.copy_(gathered_source),
                "map (not fault-safe)": lambda: old_gather_from_map(fd, half, gathered_np),
                "bounce buffer": fused(False, gather), "fused": fused(True, gather)},
        }
        for (case, written), paths in cases.items():
            times: dict[str, list[float]] = {name: [] for name in paths}
            reference = None
            for rep in range(reps + 1):  # round 0 warms up, untimed
                order = list(paths.items())
                for name, run in order if rep % 2 else order[::-1]:
                    took = _time(run)
                    if rep:
                        times[name].append(took)
                    if name != "memcpy floor":
                        result = (converted if case.startswith("convert") else gathered).clone()
                        reference = result if reference is None else reference
                        assert torch.equal(result, reference), (case, name)
            out.append({"case": case, "written": written,
                        "seconds": {name: statistics.median(v) for name, v in times.items()}})
        os.close(fd)
        os.environ.pop("LOADER_FUSED_READS", None)
    return out


def _load_child(kind: str) -> dict[str, Any]:
    """One fresh process: a float32 load, a tp=2 rank-0 load, or the floor's copy of as many bytes."""
    import torch

    import loader
    from benchmarks.measure import touch_pages
    from loader.testing import simulated_tp

    if kind.startswith("floor:"):
        nbytes = int(kind.split(":")[1])
        source = torch.ones(nbytes // 4, dtype=torch.float32)  # resident before the clock
        began = time.perf_counter()
        torch.empty_like(source).copy_(source)
        return {"seconds": time.perf_counter() - began}
    began = time.perf_counter()
    with simulated_tp(0, 2 if kind == "tp2" else 1):
        model = loader.load_model(str(CHECKPOINT), dtype="float32" if kind == "float32" else "bfloat16")
    touch_pages(model)  # mapped parameters are populated lazily: every page present, as after a copy
    took = time.perf_counter() - began
    written = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"seconds": took, "parameter_bytes": written}


def _loads(reps: int) -> list[dict[str, Any]]:
    """Part 2: fresh processes, each kind fused and bounced alternating, then the floor of its bytes."""

    from benchmarks.runner import json_child

    def child(kind: str, fused: bool) -> dict[str, Any]:
        return json_child([sys.executable, __file__, "--child", kind], {"LOADER_FUSED_READS": "1" if fused else "0"})

    for path in sorted(CHECKPOINT.glob("*.safetensors")):
        path.read_bytes()  # warm
    results = []
    for kind, label in (("float32", "bf16 checkpoint loaded as float32"), ("tp2", "tp=2, rank 0 (bfloat16)")):
        times: dict[str, list[float]] = {"fused": [], "bounce buffer": [], "memcpy floor": []}
        written = child(kind, True)["parameter_bytes"]  # warm-up, untimed
        for rep in range(reps):
            order = [("fused", True), ("bounce buffer", False)]
            for name, fused in order if rep % 2 else order[::-1]:
                times[name].append(child(kind, fused)["seconds"])
            times["memcpy floor"].append(child(f"floor:{written}", True)["seconds"])
        results.append({"case": label, "written": written,
                        "seconds": {name: statistics.median(v) for name, v in times.items()}})
    return results


def render(reads: list[dict[str, Any]], loads: list[dict[str, Any]], header: str, command: str) -> str:
    lines = [header, "", "Reads (one process, warm file, pre-faulted destination):", "",
             "| read | bytes written | memcpy floor s | map (not fault-safe) s | bounce buffer s | fused s | "
             "fused / floor | bounce / floor |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in reads:
        s = row["seconds"]
        lines.append(f"| {row['case']} | {row['written'] / 2**20:.0f} MiB | {s['memcpy floor']:.4f} | "
                     f"{s['map (not fault-safe)']:.4f} | {s['bounce buffer']:.4f} | {s['fused']:.4f} | "
                     f"{s['fused'] / s['memcpy floor']:.2f} | {s['bounce buffer'] / s['memcpy floor']:.2f} |")
    if loads:
        lines += ["", "Loads (a fresh process per run; the floor copies the parameter bytes into fresh memory):", "",
                  "| load | parameter bytes | memcpy floor s | bounce buffer s | fused s | fused / floor | "
                  "bounce / floor |", "|---|---:|---:|---:|---:|---:|---:|"]
        for row in loads:
            s = row["seconds"]
            lines.append(f"| {row['case']} | {row['written'] / 1e9:.3f} GB | {s['memcpy floor']:.3f} | "
                         f"{s['bounce buffer']:.3f} | {s['fused']:.3f} | {s['fused'] / s['memcpy floor']:.2f} | "
                         f"{s['bounce buffer'] / s['memcpy floor']:.2f} |")
    lines += ["", f"Reproduce: `{command}`"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--load-reps", type=int, default=5, help="0: reads only")
    parser.add_argument("--results", type=Path, help="write the tables into this RESULTS.md's section")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_load_child(args.child)))
        return 0
    from benchmarks.report import section_meta, show_section

    began = time.monotonic()
    meta = section_meta("bench_converting_reads.py", sys.argv[1:], CHECKPOINT, args.load_reps, REPO)
    reads = _reads(args.size_mb, args.reps)
    loads = _loads(args.load_reps) if args.load_reps else []
    header = "\n".join([
        "## Converting and row-gathering reads against the memcpy floor (issue 32, item 3)", "",
        f"- Date: {meta['date']}; {time.monotonic() - began:.0f} s",
        f"- Machine: {meta['machine']}",
        f"- Software: {meta['software']}",
        f"- Environment: {meta['environment']}",
        f"- Reads: a {args.size_mb} MiB bf16 tensor (8 KiB rows), medians of {args.reps}; loads: "
        f"`{meta['checkpoint']}`, medians of {args.load_reps} fresh processes per path",
    ])
    command = meta["command"]
    table = render(reads, loads, header, command)
    show_section(table, args.results, TAG)
    return 0


if __name__ == "__main__":
    sys.exit(main())
