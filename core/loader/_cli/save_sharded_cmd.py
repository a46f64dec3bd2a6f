"""``loader save-sharded SOURCE OUT --tp N``: cut a checkpoint per tensor-parallel rank, once."""

from __future__ import annotations

import argparse

from .._sharded.save import save_sharded
from .output import format_bytes, print_json

__all__ = ["run_save_sharded"]


def run_save_sharded(args: argparse.Namespace) -> int:
    saved = save_sharded(args.source, args.out, tp_size=args.tp, dtype=args.dtype, load_format=args.load_format,
                         max_part_bytes=int(args.max_part_gb * 1000**3), revision=args.revision)
    if args.json:
        print_json({"folder": saved.folder, "tp_size": saved.tp_size, "files": list(saved.files),
                    "bytes_written": saved.bytes_written})
        return 0
    print(f"wrote {len(saved.files)} files ({format_bytes(saved.bytes_written)}) for tp={saved.tp_size} "
          f"to {saved.folder}")
    print(f"load with: loader load {saved.folder} --format sharded_state  (under torchrun --nproc-per-node "
          f"{saved.tp_size})")
    return 0
