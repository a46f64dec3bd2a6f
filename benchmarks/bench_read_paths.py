"""Which way of reading a file into fresh memory is fastest here? (issue 6, the fast-reader question)

On one ~1 GB bf16 safetensors file, warm in the page cache, one process,
several repetitions, rotating order, a fresh destination every repetition
except for the reused-buffer floor:

- ``os.preadv`` in 8 MiB chunks into a fresh ``torch.empty`` buffer, 1 thread
  (page faults of the fresh buffer dominate);
- the same with N threads (``preadv`` releases the GIL);
- into a fresh anonymous ``mmap`` arena, 2 MiB aligned and advised
  ``MADV_HUGEPAGE``, with 1 and N threads (512x fewer page faults), and the
  same arena mapped ``MAP_SHARED`` (Python's default: shmem, no huge pages);
- into one reused, pre-faulted buffer, 1 and N threads: the page-cache memcpy floor.

Prints medians, GB/s and ratios; ``--json FILE`` writes them for ``run_all.py``.
Usage: ``python benchmarks/bench_read_paths.py [--size-gb 1] [--reps 5] [--threads 2]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CHUNK = 8 << 20
HUGE_PAGE = 2 << 20
OUT_DIR = Path(__file__).resolve().parent / "out"


def ensure_file(size_gb: float, folder: Path) -> Path:
    """A single-tensor bf16 safetensors file of about ``size_gb`` GB, written once and cached."""
    target = folder / f"read-paths-{size_gb:g}gb.safetensors"
    elements = int(size_gb * 1e9) // 2
    if target.is_file() and target.stat().st_size >= elements * 2:
        return target
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    values = torch.empty(elements, dtype=torch.bfloat16)
    generator = torch.Generator().manual_seed(0)
    step = 1 << 26
    for start in range(0, elements, step):  # in slices: no 2x float32 copy of the whole file
        part = values[start:start + step]
        part.copy_(torch.empty(part.numel(), dtype=torch.float32).normal_(0.0, 0.02, generator=generator))
    partial = target.with_suffix(".partial")
    save_file({"weight": values}, str(partial))
    partial.rename(target)
    return target


def data_range(path: Path) -> tuple[int, int]:
    """``(offset, length)`` of the tensor bytes after the safetensors header."""
    with open(path, "rb") as handle:
        header = int.from_bytes(handle.read(8), "little")
    offset = 8 + header
    return offset, path.stat().st_size - offset


def _read_chunk(fd: int, view: memoryview, file_offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], file_offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {file_offset + done}")
        done += n


def read_into(fd: int, view: memoryview, offset: int, pool: ThreadPoolExecutor | None) -> None:
    """Fill ``view`` from the file at ``offset`` in 8 MiB chunks, on ``pool`` if given."""
    starts = range(0, len(view), CHUNK)
    if pool is None:
        for start in starts:
            _read_chunk(fd, view[start:start + CHUNK], offset + start)
        return
    for future in [pool.submit(_read_chunk, fd, view[s:s + CHUNK], offset + s) for s in starts]:
        future.result()


def anon_huge_pages_bytes() -> int:
    """``AnonHugePages`` of this process: shows whether the advised arena really got huge pages."""
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Arena:
    """A fresh anonymous mapping, 2 MiB aligned, advised for transparent huge pages.

    ``MAP_PRIVATE`` matters: ``mmap.mmap(-1, n)`` defaults to ``MAP_SHARED``, which is
    shmem, governed by ``shmem_enabled`` (usually ``never``), so the advice is ignored
    and every 4 KiB fault goes through tmpfs; ``shared=True`` measures that case.
    """

    def __init__(self, nbytes: int, *, shared: bool = False) -> None:
        flags = mmap.MAP_SHARED if shared else mmap.MAP_PRIVATE
        self._map = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=flags | mmap.MAP_ANONYMOUS)
        address = ctypes.addressof(ctypes.c_char.from_buffer(self._map))
        start = (-address) % HUGE_PAGE
        if hasattr(mmap, "MADV_HUGEPAGE"):
            self._map.madvise(mmap.MADV_HUGEPAGE)
        self.view = memoryview(self._map)[start:start + nbytes]

    def close(self) -> None:
        self.view.release()
        self._map.close()


def variants(fd: int, offset: int, length: int, threads: int) -> dict[str, tuple[str, Callable[[], Any]]]:
    """``name -> (label, one timed repetition)``; each returns what must stay alive until timing ends."""
    import torch

    pool = ThreadPoolExecutor(threads) if threads > 1 else None
    reused = bytearray(length)  # zero-filled: pre-faulted once, outside every timing
    reused_view = memoryview(reused)

    def fresh_tensor(use_pool: ThreadPoolExecutor | None) -> Any:
        buffer = torch.empty(length, dtype=torch.uint8)
        read_into(fd, buffer.numpy().data, offset, use_pool)
        return buffer

    def fresh_arena(use_pool: ThreadPoolExecutor | None, shared: bool = False) -> Any:
        arena = Arena(length, shared=shared)
        read_into(fd, arena.view, offset, use_pool)
        return arena

    def into_reused(use_pool: ThreadPoolExecutor | None) -> Any:
        read_into(fd, reused_view, offset, use_pool)
        return None

    n = f"{threads} threads"
    table: dict[str, tuple[str, Callable[[], Any]]] = {
        "fresh_1t": ("preadv into fresh torch.empty, 1 thread", lambda: fresh_tensor(None)),
        "fresh_nt": (f"preadv into fresh torch.empty, {n}", lambda: fresh_tensor(pool)),
        "huge_1t": ("preadv into fresh MADV_HUGEPAGE arena, 1 thread", lambda: fresh_arena(None)),
        "huge_nt": (f"preadv into fresh MADV_HUGEPAGE arena, {n}", lambda: fresh_arena(pool)),
        "shared_nt": (f"same arena but MAP_SHARED (mmap.mmap(-1, n)), {n}",
                      lambda: fresh_arena(pool, shared=True)),
        "reused_1t": ("preadv into one reused buffer, 1 thread (floor)", lambda: into_reused(None)),
        "reused_nt": (f"preadv into one reused buffer, {n}", lambda: into_reused(pool)),
    }
    if pool is None:
        table = {k: v for k, v in table.items() if not k.endswith("_nt")}
    return table


def _release(kept: Any) -> None:
    if isinstance(kept, Arena):
        kept.close()


def measure(path: Path, reps: int, threads: int) -> dict[str, Any]:
    offset, length = data_range(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        table = variants(fd, offset, length, threads)
        read_into(fd, memoryview(bytearray(length)), offset, None)  # warm the page cache
        names = list(table)
        seconds: dict[str, list[float]] = {name: [] for name in names}
        huge_backed = 0
        for rep in range(reps):
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                start = time.perf_counter()
                kept = table[name][1]()
                seconds[name].append(time.perf_counter() - start)
                if name == "huge_1t":
                    huge_backed = max(huge_backed, anon_huge_pages_bytes())
                _release(kept)
                del kept
    finally:
        os.close(fd)
    floor = statistics.median(seconds["reused_1t"])
    rows = []
    for name in names:
        median = statistics.median(seconds[name])
        rows.append({"name": name, "label": table[name][0], "median": median, "seconds": seconds[name],
                     "gb_per_s": length / median / 1e9, "vs_floor": median / floor})
    return {"ok": True, "file": str(path), "bytes": length, "reps": reps, "threads": threads, "rows": rows,
            "huge_pages_backing_bytes": huge_backed, "thp": _thp_setting()}


def _thp_setting() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError:
        return "unknown"


def print_table(result: dict[str, Any]) -> None:
    print(f"{result['bytes'] / 1e9:.2f} GB from {result['file']} (page cache warm), median of "
          f"{result['reps']}; transparent_hugepage: {result['thp']}; arena backed by huge pages: "
          f"{result['huge_pages_backing_bytes'] / 2**20:.0f} MiB")
    fresh = next(r["median"] for r in result["rows"] if r["name"] == "fresh_1t")
    print(f"{'read path':<64} {'median s':>9} {'worst s':>8} {'GB/s':>7} {'÷ floor':>8} {'÷ fresh 1t':>10}")
    for row in result["rows"]:
        print(f"{row['label']:<64} {row['median']:>9.3f} {max(row['seconds']):>8.3f} {row['gb_per_s']:>7.2f} "
              f"{row['vs_floor']:>8.2f} {row['median'] / fresh:>10.2f}")
    print("(worst: the first huge-page arena of a process can stall in direct compaction when memory is "
          "fragmented, transparent_hugepage/defrag permitting)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="file size in GB (default 1)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions per read path (default 5)")
    parser.add_argument("--threads", type=int, default=2, help="threads of the multi-threaded paths (default 2)")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="where the test file is cached")
    parser.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    shown = [f"--size-gb {args.size_gb:g}", f"--reps {args.reps}", f"--threads {args.threads}"]
    command = " ".join(["python benchmarks/bench_read_paths.py", *shown])
    try:
        path = ensure_file(args.size_gb, args.out_dir)
        result = measure(path, max(1, args.reps), max(1, args.threads))
    except Exception as exc:
        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(f"bench_read_paths failed: {result['error']}", file=sys.stderr)
    result["command"] = command
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if not result["ok"]:
        return 1
    print_table(result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
