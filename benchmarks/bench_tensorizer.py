"""Tensorizer benchmarks: the benchmark Llama (bf16) from a ``.tensors`` file through loader, vs safetensors
(mapped) through loader, vs tensorizer's own ``TensorDeserializer`` into a ``transformers`` model; and at tp=2,
rank 0 of the per-rank fast path vs rank 0 of the sharded-state format. Each load in a fresh process, medians.

``python benchmarks/bench_tensorizer.py --gb 1 --reps 3`` (local files; the page cache warm before each load).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files, warm_page_cache

OUT = Path(__file__).resolve().parent / "out"


def _child(kind: str, source: str) -> None:
    """One timed load in this fresh process; prints its seconds as JSON."""
    import torch

    start = time.perf_counter()
    if kind == "tensorizer-deserializer":
        import transformers
        from tensorizer import TensorDeserializer, utils

        config = transformers.AutoConfig.from_pretrained(str(Path(source).parent))
        with utils.no_init_or_tensor():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        TensorDeserializer(source, device="cpu").load_into_module(model)
    else:
        import loader
        from loader.testing import simulated_tp

        tp = 2 if kind.endswith("tp2") else 1
        with simulated_tp(0, tp):
            model = loader.load_model(source, dtype="bfloat16")
    for param in model.parameters():  # touch every page, as run_all.py does
        param.data.view(-1)[:: max(1, 4096 // param.element_size())].sum()
    print(json.dumps({"seconds": time.perf_counter() - start}))


def _prepare(gb: float) -> dict[str, str]:
    folder, _, _ = ensure_checkpoint(OUT, gb)
    tz = folder.parent / f"{folder.name}-tensorizer"
    if not (tz / "model.tensors").exists():
        import torch
        import transformers
        from tensorizer import TensorSerializer

        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16)
        tz.mkdir(exist_ok=True)
        model.config.save_pretrained(tz)
        serializer = TensorSerializer(str(tz / "model.tensors"))
        serializer.write_module(model)
        serializer.close()
        del model
    per_rank = folder.parent / f"{folder.name}-tensorized-tp2"
    if not per_rank.exists():
        from loader_plugin_tensorizer import save_tensorized

        save_tensorized(str(folder), per_rank, tp_size=2)
    sharded = folder.parent / f"{folder.name}-sharded-tp2"
    if not sharded.exists():
        subprocess.run([sys.executable, "-m", "loader._cli.main", "save-sharded", str(folder), str(sharded),
                        "--tp", "2"], check=True)
    return {"safetensors (mapped)": str(folder), "tensorizer via loader": str(tz),
            "tensorizer-deserializer": str(tz / "model.tensors"), "per-rank tensorizer tp2": str(per_rank),
            "sharded-state tp2": str(sharded)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SOURCE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*args.child)
        return 0
    paths = _prepare(args.gb)
    times: dict[str, list[float]] = {label: [] for label in paths}
    for _ in range(args.reps):
        for label, source in paths.items():
            kind = "tensorizer-deserializer" if label == "tensorizer-deserializer" else label.split()[-1]
            files = shard_files(Path(source)) if Path(source).is_dir() else [Path(source)]
            warm_page_cache(files or sorted(Path(source).glob("*")))
            done = subprocess.run([sys.executable, __file__, "--child", kind, source], capture_output=True,
                                  text=True, check=True)
            times[label].append(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])
    base = statistics.median(times["tensorizer-deserializer"])
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"{label:28s} median {median:7.3f} s  ({median / base:.2f}x tensorizer's deserializer)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
