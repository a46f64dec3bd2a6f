"""What do fault-safe reads cost? (issue 16, item 9: no SIGBUS when a checkpoint shrinks under a load)

Two reads used to go through a memory map of the checkpoint after a size check, and died of ``SIGBUS``
when another process truncated the file during the copy:

- a converting read (bf16 file -> float32 parameter): ``dest.copy_(view of a map)``, torch converting
  straight out of the page cache (the old ``mapped_copy.copy_through_map``, reproduced below);
- an inner-dim narrow with short rows (a row-parallel TP shard): numpy's strided copy out of a map
  (the old ``parallel_read._gather_from_map``, reproduced below).

Both now use positioned reads into small reused bounce buffers (``tensor_read._read_through_bounce``,
``parallel_read._gather_through_buffer``). This script times old and new in the same process, on the
same warm file and the same pre-faulted destination, alternating, and prints medians and new/old ratios.

Usage: ``python benchmarks/bench_fault_safe_reads.py [--size-mb 256] [--reps 7]``.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from loader_plugin_safetensors import open_checkpoint_file, tensor_read
from loader_plugin_safetensors.parallel_read import read_layout
from loader_plugin_safetensors.tensor import SafetensorsTensor


def old_copy_through_map(fd: int, tensor: SafetensorsTensor, dest: torch.Tensor) -> None:
    """The converting read before issue 16: torch copies out of a private map of the span."""
    layout = tensor.layout()
    start = layout.offset - layout.offset % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(fd, layout.end - start, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE,
                       offset=start)
    flat = torch.frombuffer(mapped, dtype=tensor.dtype, count=(layout.end - layout.offset) // tensor.itemsize,
                            offset=layout.offset - start)
    strides, step = [], 1
    for size in reversed(tensor.info.shape):
        strides.append(step)
        step *= size
    source = flat.as_strided(tensor.shape, tuple(reversed(strides)), flat.storage_offset())
    with torch.no_grad():
        dest.copy_(source)
    del flat, source
    with contextlib.suppress(BufferError):
        mapped.close()


def old_gather_from_map(fd: int, tensor: SafetensorsTensor, dest: np.ndarray) -> None:
    """The short-segment gather before issue 16: a strided numpy copy out of a read-only map."""
    layout = tensor.layout()
    start = layout.offset - layout.offset % mmap.ALLOCATIONGRANULARITY
    mapped = mmap.mmap(fd, layout.end - start, prot=mmap.PROT_READ, offset=start)
    counts = tuple(count for count, _ in layout.grid)
    source = np.ndarray((*counts, layout.segment), dtype=np.uint8, buffer=mapped, offset=layout.offset - start,
                        strides=(*(stride for _, stride in layout.grid), 1))
    np.copyto(dest.reshape(*counts, layout.segment), source)
    del source
    with contextlib.suppress(BufferError):
        mapped.close()


def _time(run: Callable[[], None]) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--chunk-mb", type=float, default=None,
                        help="override tensor_read.BOUNCE_CHUNK_BYTES (the conversion's chunk)")
    args = parser.parse_args()
    if args.chunk_mb is not None:
        tensor_read.BOUNCE_CHUNK_BYTES = int(args.chunk_mb * (1 << 20))
    from safetensors.torch import save_file

    cols = 4096  # 8 KiB rows of bf16; the TP narrow keeps 4 KiB of each (the gather path)
    rows = args.size_mb * (1 << 20) // (cols * 2)
    with tempfile.TemporaryDirectory(prefix="fault-safe-") as tmp:
        path = Path(tmp) / "w.safetensors"
        save_file({"w": torch.randn(rows, cols).bfloat16()}, str(path))
        path.read_bytes()  # warm the page cache
        checkpoint = open_checkpoint_file(path)
        whole = checkpoint.tensor("w")
        half = whole.narrow(1, 0, cols // 2)
        converted = torch.ones(rows, cols, dtype=torch.float32)  # pre-faulted: no first-touch cost
        gathered = torch.ones(rows, cols // 2, dtype=torch.bfloat16)
        gathered_np = gathered.view(-1).view(torch.uint8).numpy()
        fd = os.open(path, os.O_RDONLY)
        cases = {
            "convert bf16->f32": (lambda: old_copy_through_map(fd, whole, converted),
                                  lambda: whole.read_into(converted)),
            "inner-dim narrow (4 KiB rows)": (
                lambda: old_gather_from_map(fd, half, gathered_np),
                lambda: read_layout(fd, half.layout(), gathered_np, path=str(path), what="w")),
        }
        expected = {"convert bf16->f32": None, "inner-dim narrow (4 KiB rows)": None}
        times: dict[tuple[str, str], list[float]] = {}
        for rep in range(args.reps + 1):  # the first round warms up, untimed
            for case, (old, new) in cases.items():
                order = [("old (map)", old), ("new (bounce)", new)]
                for label, run in order if rep % 2 else order[::-1]:
                    took = _time(run)
                    if rep:
                        times.setdefault((case, label), []).append(took)
                result = (converted if case.startswith("convert") else gathered).clone()
                if expected[case] is None:
                    expected[case] = result
                assert torch.equal(result, expected[case]), case
        os.close(fd)
    nbytes = rows * cols * 2
    print(f"{nbytes / 2**20:.0f} MiB bf16 tensor ({rows} x {cols}), warm page cache, {args.reps} reps, "
          f"conversion chunk {tensor_read.BOUNCE_CHUNK_BYTES / 2**20:g} MiB, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, torch threads {torch.get_num_threads()}")
    print("| read | old (map) median s | new (bounce) median s | new ÷ old | new source GB/s |")
    print("|---|---:|---:|---:|---:|")
    for case in cases:
        old_s = statistics.median(times[(case, "old (map)")])
        new_s = statistics.median(times[(case, "new (bounce)")])
        source = nbytes if case.startswith("convert") else nbytes // 2
        print(f"| {case} | {old_s:.4f} | {new_s:.4f} | {new_s / old_s:.2f} | {source / new_s / 1e9:.2f} |")


if __name__ == "__main__":
    main()
