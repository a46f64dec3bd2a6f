"""Warm-page-cache read throughput of the safetensors reader, against ``safetensors`` itself.

Writes one bf16 tensor (about 200 MB by default) to a temporary folder, reads it
once to warm the page cache, then reports the best of ``--repeat`` runs of each
path with each ``LOADER_READ_THREADS`` value::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_safetensors_read.py --mb 200

GB/s counts tensor bytes delivered (for narrowed reads, the slice's bytes).
"fresh" destinations are allocated just before the read (like parameters just
materialised from the meta device: every page faults on first write);
"touched" ones were written before (faults already paid).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from loader_plugin_safetensors import SafetensorsTensor, open_checkpoint_file

Case = tuple[str, int, Callable[[], Callable[[], object]]]


def _best(prepare: Callable[[], Callable[[], object]], repeat: int) -> float:
    """Best time of ``repeat`` runs; ``prepare`` (untimed) returns the timed call."""
    times = []
    for _ in range(repeat):
        run = prepare()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


Prepare = Callable[[], Callable[[], object]]


def _into(handle: SafetensorsTensor, make_out: Callable[[], torch.Tensor]) -> Prepare:
    """Prepare: build the destination (untimed); run: ``handle.read_into`` it."""

    def prepare() -> Callable[[], object]:
        out = make_out()
        return lambda: handle.read_into(out)

    return prepare


def _reference(reader: Any, make_out: Callable[[], torch.Tensor],
               index: tuple[slice, ...] | None = None) -> Prepare:
    """The same through ``safetensors``: ``get_tensor`` (or ``get_slice[index]``) then ``copy_``."""

    def prepare() -> Callable[[], object]:
        out = make_out()
        if index is None:
            return lambda: out.copy_(reader.get_tensor("w"))
        return lambda: out.copy_(reader.get_slice("w")[index])

    return prepare


def _cases(path: Path, rows: int, cols: int) -> list[Case]:
    handle = open_checkpoint_file(path).tensor("w")
    reader = safe_open(str(path), framework="pt")
    touched = torch.ones(rows, cols, dtype=torch.bfloat16)
    touched_f32 = torch.ones(rows, cols, dtype=torch.float32)
    half_rows = handle.narrow(0, rows // 2, rows - rows // 2)
    half_cols = handle.narrow(1, cols // 2, cols // 2)
    eighth_cols = handle.narrow(1, 0, cols // 8)

    def fresh() -> torch.Tensor:
        return torch.empty(rows, cols, dtype=torch.bfloat16)

    def touched_as(shape: tuple[int, ...]) -> Callable[[], torch.Tensor]:
        n = 1
        for s in shape:
            n *= s
        return lambda: touched.view(-1)[:n].view(shape)

    n = handle.nbytes
    return [
        ("safetensors get_tensor + copy_ (fresh bf16)", n, _reference(reader, fresh)),
        ("ours read_into (fresh bf16)", n, _into(handle, fresh)),
        ("safetensors get_tensor + copy_ (touched bf16)", n, _reference(reader, lambda: touched)),
        ("ours read_into (touched bf16)", n, _into(handle, lambda: touched)),
        ("safetensors get_tensor + copy_ (touched f32)", n, _reference(reader, lambda: touched_f32)),
        ("ours read_into (touched f32, converts)", n, _into(handle, lambda: touched_f32)),
        ("ours read() new tensor", n, lambda: handle.read),
        ("safetensors get_slice[:, half] + copy_ (touched)", half_cols.nbytes,
         _reference(reader, touched_as(half_cols.shape), (slice(None), slice(cols // 2, cols)))),
        ("ours narrow(dim 0, half) read_into (touched)", half_rows.nbytes,
         _into(half_rows, touched_as(half_rows.shape))),
        ("ours narrow(dim 1, half) read_into (touched)", half_cols.nbytes,
         _into(half_cols, touched_as(half_cols.shape))),
        ("ours narrow(dim 1, 1/8) read_into (touched)", eighth_cols.nbytes,
         _into(eighth_cols, touched_as(eighth_cols.shape))),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--mb", type=int, default=200, help="tensor size in MB")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", default="1,2", help="comma-separated LOADER_READ_THREADS values")
    parser.add_argument("--dir", default=None, help="where to write the file (default: a temp dir)")
    args = parser.parse_args()

    cols = 16384
    rows = args.mb * 1_000_000 // (cols * 2)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / "big.safetensors"
        save_file({"w": torch.randn(rows, cols).bfloat16()}, str(path))
        print(f"{rows}x{cols} bf16 = {rows * cols * 2 / 1e6:.0f} MB, cpus={os.cpu_count()}, warm page cache")
        path.read_bytes()
        cases = _cases(path, rows, cols)
        for threads in args.threads.split(","):
            os.environ["LOADER_READ_THREADS"] = threads.strip()
            for label, size, prepare in cases:
                if label.startswith("safetensors") and threads != args.threads.split(",")[0]:
                    continue
                seconds = _best(prepare, args.repeat)
                tag = "" if label.startswith("safetensors") else f" [threads={threads}]"
                print(f"{label + tag:58s} {size / seconds / 1e9:6.2f} GB/s")


if __name__ == "__main__":
    main()
