"""PyTorch ``.bin`` checkpoints: loader's own pickle-zip reader against ``torch.load`` and ``from_pretrained``.

``python benchmarks/bench_bin_read.py [--reps 5] [--size-gb 1]`` rewrites the
benchmark's own Llama checkpoint (:mod:`benchmarks.checkpoints`) the way
``save_pretrained(safe_serialization=False)`` does -- ``pytorch_model-0000N-of-0000M.bin``
zip archives written by ``torch.save`` plus ``pytorch_model.bin.index.json`` -- under
``benchmarks/out/llama-<size>gb-bin/`` (once; reused while the source is unchanged), then
times, each in a fresh process under the rules of ``run_all.py`` (warm page cache, one
untimed warm-up each, order rotating, clock around the load until every page is touched,
peak RSS as ``VmHWM``):

- ``loader.load_model`` (bf16): the safetensors plugin's pickle reader, which never
  unpickles code (only the records ``torch.save`` writes) and maps the storages;
- ``torch.load(f, mmap=True, weights_only=True)`` of every shard: the fastest a
  state dict alone comes out of these files (no model is built: a floor, not a peer);
- ``transformers.from_pretrained`` (bf16), which also reads them with ``torch.load``.

It writes its section of ``benchmarks/RESULTS.md`` between ``<!-- bin -->`` markers,
which ``run_all.py`` carries over.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files
from benchmarks.host_memory import warm_host_memory
from benchmarks.paths import PATHS
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT, measure_rotating

BENCH_DIR = Path(__file__).resolve().parent
NAMES = ("loader", "torch_load_mmap", "transformers")
TAG = "bin"


def ensure_bin_checkpoint(source: Path) -> Path:
    """``source`` (safetensors shards) rewritten as ``.bin`` shards with the same names and split."""
    import torch
    from safetensors.torch import load_file

    target = source.parent / f"{source.name}-bin"
    marker = target / ".complete"
    stamp = json.dumps(sorted((p.name, p.stat().st_size) for p in shard_files(source)))
    if marker.is_file() and marker.read_text() == stamp:
        return target
    target.mkdir(parents=True, exist_ok=True)
    marker.unlink(missing_ok=True)
    index = json.loads((source / "model.safetensors.index.json").read_text())
    renamed: dict[str, str] = {}
    for shard in shard_files(source):
        name = shard.name.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save(load_file(str(shard)), target / name)
        renamed[shard.name] = name
    index["weight_map"] = {key: renamed[file] for key, file in index["weight_map"].items()}
    (target / "pytorch_model.bin.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (target / "config.json").write_text((source / "config.json").read_text())
    marker.write_text(stamp)
    return target


def bin_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("pytorch_model-*.bin"))


def measure(folder: Path, reps: int, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Each path ``reps`` times (plus one warm-up), the order rotating; records per path."""
    return measure_rotating([PATHS[name] for name in NAMES], folder, bin_files(folder), reps, out_dir, 900)


def render(summary: dict[str, dict[str, Any]], meta: dict[str, str]) -> str:
    """The Markdown section (without its markers)."""
    lines = ["## PyTorch `.bin` checkpoints", "",
             f"- Date: {meta['date']}", f"- Machine: {meta['machine']}", f"- Software: {meta['software']}",
             f"- Environment: {meta['environment']}", f"- Command: `{meta['command']}`",
             f"- Host memory: {meta['host_memory']}", "",
             f"`{meta['checkpoint']}`: the 1 GB benchmark Llama rewritten by `torch.save` as `.bin` shards with an "
             f"index, bf16, {meta['reps']} repetitions per path, each in a fresh process (warm page cache, order "
             "rotating, clock until every tensor page is touched). `torch.load` builds no model: it is the floor "
             "for these files, not a peer. loader fuses q/k/v and gate/up into one parameter each: in a `.bin` the "
             "parts are separate zip entries, never adjacent, so those bytes (27 % here) are copied, not mapped.", "",
             "| path | median s | min-max s | ÷ loader | peak RSS | peak - after import | status |",
             "|---|---:|---:|---:|---:|---:|---|"]
    base = statistics.median(summary["loader"]["seconds"]) if summary["loader"]["seconds"] else None
    for name in NAMES:
        entry = summary[name]
        secs = entry["seconds"]
        status = "ok" if not entry["errors"] else f"{len(entry['errors'])} failed: {entry['errors'][0]}"
        if not secs:
            lines.append(f"| {entry['label']} | — | — | — | — | — | {status} |")
            continue
        med = statistics.median(secs)
        ratio = f"{med / base:.2f}" if base else "—"
        peak = statistics.median(entry["peak_rss"]) / 2**20
        growth = statistics.median(entry["growth"]) / 2**20
        lines.append(f"| {entry['label']} | {med:.3f} | {min(secs):.3f}-{max(secs):.3f} | {ratio} | "
                     f"{peak:,.0f} MiB | {growth:,.0f} MiB | {status} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    parser.add_argument("--no-warm-memory", action="store_true",
                        help="skip the untimed pass over free memory (see benchmarks/host_memory.py): loader copies "
                        "the fused layers' parts into fresh memory, whose first touch this VM charges several times")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    source, _, _ = ensure_checkpoint(args.out_dir, args.size_gb)
    folder = ensure_bin_checkpoint(source)
    host_memory = "not warmed (--no-warm-memory)" if args.no_warm_memory else warm_host_memory()
    meta = section_meta("bench_bin_read.py", argv if argv is not None else sys.argv[1:], folder, args.reps,
                        REPO_ROOT)
    meta["host_memory"] = host_memory
    section = render(measure(folder, max(1, args.reps), args.out_dir), meta)
    write_section(args.results, TAG, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
