"""The transformers fallback against ``transformers.from_pretrained`` on the 1 GB benchmark checkpoint.

``python benchmarks/bench_fallback.py [--reps 5] [--size-gb 1]`` loads the
benchmark's own Llama checkpoint (:mod:`benchmarks.checkpoints`) forced to the
fallback (``model_impl="transformers"``: transformers' ``LlamaForCausalLM``
filled by loader's pipeline) and with ``from_pretrained``, each in a fresh
process under the rules of ``run_all.py`` (warm page cache, one untimed warm-up
each, order alternating, clock around the load until every page is touched,
peak RSS as ``VmHWM``). It writes its section of ``benchmarks/RESULTS.md``
between ``<!-- fallback -->`` markers, which ``run_all.py`` carries over.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files
from benchmarks.paths import PATHS
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT, measure_rotating

BENCH_DIR = Path(__file__).resolve().parent
NAMES = ("loader_fallback", "transformers")
TAG = "fallback"


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def measure(folder: Path, reps: int, out_dir: Path) -> dict[str, dict[str, Any]]:
    """Each path ``reps`` times (plus one warm-up), the order rotating; records per path."""
    return measure_rotating([PATHS[name] for name in NAMES], folder, shard_files(folder), reps, out_dir, 600)


def render(summary: dict[str, dict[str, Any]], meta: dict[str, str]) -> str:
    """The Markdown section (without its markers)."""
    fallback, peer = summary["loader_fallback"], summary["transformers"]
    lines = ["## Transformers fallback (issue 15)", "",
             f"- Date: {meta['date']}", f"- Machine: {meta['machine']}", f"- Software: {meta['software']}",
             f"- Environment: {meta['environment']}", f"- Command: `{meta['command']}`", "",
             f"`{meta['checkpoint']}`, bf16, {meta['reps']} repetitions per path, each in a fresh process "
             "(warm page cache, order alternating, clock until every parameter page is touched).", "",
             "| path | median s | min-max s | peak RSS | RSS after import | peak - after import | status |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for entry in (fallback, peer):
        secs, rss = entry["seconds"], entry["peak_rss"]
        status = "ok" if not entry["errors"] else f"{len(entry['errors'])} failed: {entry['errors'][0]}"
        span = f"{min(secs):.3f}-{max(secs):.3f}" if secs else "—"
        med = _median(secs)
        peak = _median([float(v) for v in rss])
        growth = _median([float(v) for v in entry["growth"]])
        if med is None or peak is None or growth is None:
            lines.append(f"| {entry['label']} | — | — | — | — | — | {status} |")
            continue
        lines.append(f"| {entry['label']} | {med:.3f} | {span} | {peak / 2**20:,.0f} MiB | "
                     f"{(peak - growth) / 2**20:,.0f} MiB | {growth / 2**20:,.0f} MiB | {status} |")
    f_s, p_s = _median(fallback["seconds"]), _median(peer["seconds"])
    f_r, p_r = _median([float(v) for v in fallback["peak_rss"]]), _median([float(v) for v in peer["peak_rss"]])
    f_g, p_g = _median([float(v) for v in fallback["growth"]]), _median([float(v) for v in peer["growth"]])
    if None not in (f_s, p_s, f_r, p_r, f_g, p_g):
        assert f_s is not None and p_s is not None and f_r is not None and p_r is not None
        assert f_g is not None and p_g is not None
        lines += ["", "| criterion | measured | result |", "|---|---|---|",
                  f"| fallback faster than from_pretrained | {f_s:.3f} s vs {p_s:.3f} s ({p_s / f_s:.2f}x) | "
                  f"{'pass' if f_s < p_s else '**fail**'} |",
                  f"| fallback peak RSS no higher | {f_r / 2**20:,.0f} MiB vs {p_r / 2**20:,.0f} MiB | "
                  f"{'pass' if f_r <= p_r else '**fail**'} |",
                  f"| fallback's load adds no more memory (peak - RSS after import) | {f_g / 2**20:,.0f} MiB vs "
                  f"{p_g / 2**20:,.0f} MiB | {'pass' if f_g <= p_g else '**fail**'} |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR / "out")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    folder, _, _ = ensure_checkpoint(args.out_dir, args.size_gb)
    meta = section_meta("bench_fallback.py", argv if argv is not None else sys.argv[1:], folder, args.reps,
                        REPO_ROOT)
    section = render(measure(folder, max(1, args.reps), args.out_dir), meta)
    write_section(args.results, TAG, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
