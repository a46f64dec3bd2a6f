"""Where a warm load's time goes, stage by stage: build, weight loading, post-processing (GGUF packing, the
embedding, heap trims) — medians over fresh loads in one process, after one untimed load.

Usage: ``python benchmarks/profile_load.py [PATH] [--threads 2] [--reps 7] [--dtype auto] [--packed-cache]``
(every load packs; with ``--packed-cache`` the loads map GGUF's packed-weights bundle instead; PATH defaults to
the SmolLM2 Q4_1 GGUF that ``scripts/fetch_smollm2.py`` fetches). Each stage's time is measured by wrapping
the function that runs it, so the stages add up to less than the total (the rest: options, the checkpoint's
header and config, the load report). Prints one Markdown table.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

STAGES = (
    ("loader._pipeline.load", "_build", "build the model"),
    ("loader._pipeline.load", "_load_weights", "load weights (parts handed to layers)"),
    ("loader._hooks", "process_weights_after_loading", "post-processing, all layers"),
    ("loader_plugin_gguf.packed.linear_packing", "pack_int4_parts", "  GGUF int4 packing"),
    ("loader_plugin_gguf.packed.embedding:GGUFEmbeddingMethod", "process_weights_after_loading", "  GGUF embedding"),
    ("loader._pipeline.postprocess", "release_freed_heap", "  heap trims"),
)


def _wrap(owner: Any, name: str, sink: dict[str, float], label: str) -> None:
    """Replace ``owner.name`` by a timed wrapper that adds each call's seconds to ``sink[label]``."""
    raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    function: Callable[..., Any] = raw.__func__ if isinstance(raw, staticmethod) else raw

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            sink[label] += time.perf_counter() - start

    setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", type=Path)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--packed-cache", action="store_true",
                        help="map GGUF's packed-weights bundle (written by the untimed first load) instead of "
                             "packing at every load")
    args = parser.parse_args(argv)
    import importlib
    import os

    # every timed load packs, unless the bundle is asked for
    os.environ["LOADER_GGUF_PACKED_CACHE"] = "1" if args.packed_cache else "0"

    import torch

    import loader

    torch.set_num_threads(args.threads)
    if args.path is None:
        sys.path.insert(0, str(REPO / "scripts"))
        from fetch_smollm2 import fetch_smollm2

        args.path = Path(fetch_smollm2())
    sink: dict[str, float] = defaultdict(float)
    for module_name, name, label in STAGES:
        module_path, _, cls = module_name.partition(":")
        try:
            owner: Any = importlib.import_module(module_path)
        except ImportError:
            continue
        _wrap(getattr(owner, cls) if cls else owner, name, sink, label)
    loader.load_model(str(args.path), dtype=args.dtype)  # imports, first-use caches: not timed
    runs: list[dict[str, float]] = []
    for _ in range(args.reps):
        sink.clear()
        start = time.perf_counter()
        model = loader.load_model(str(args.path), dtype=args.dtype)
        total = time.perf_counter() - start
        del model
        runs.append({"total": total, **sink})
    print(f"{args.path.name}, dtype {args.dtype}, {args.threads} threads, median of {args.reps} warm loads\n")
    print("| stage | ms |\n|---|---:|")
    for label in ("total", *(label for _, _, label in STAGES)):
        values = [run.get(label, 0.0) for run in runs]
        print(f"| {label} | {statistics.median(values) * 1e3:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
