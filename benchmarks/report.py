"""Summaries, the acceptance checks of issue 6 and ``RESULTS.md`` from the raw run records.

Raw records (one per child process and rank) go in; medians, ratios against
``loader.load_model`` and a Markdown page come out. The hand-written closing
note between ``<!-- notes -->`` and ``<!-- /notes -->`` in an existing
``RESULTS.md`` is carried over, so rerunning the benchmark keeps the analysis.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["PathSummary", "acceptance_checks", "carried_block", "carried_notes", "render_markdown", "replace_block",
           "section_meta", "show_section", "summarize", "write_section"]

_NOTES = re.compile(r"<!-- notes -->\n(.*?)<!-- /notes -->", re.S)
_DEFAULT_NOTE = ("_Closing note (by hand, kept across reruns): what limits the remaining gap between "
                 "`loader.load_model` and the floor._\n")

MAIN_PATHS = ("loader", "transformers", "vllm_loop", "floor")


@dataclass
class PathSummary:
    """One path at one size: per-repetition seconds (slowest rank under tp) and memory."""

    name: str
    label: str
    seconds: list[float] = field(default_factory=list)
    import_seconds: list[float] = field(default_factory=list)
    peak_rss: list[int] = field(default_factory=list)
    baseline_rss: list[int] = field(default_factory=list)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped: str | None = None

    @property
    def median(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None

    @property
    def status(self) -> str:
        if self.skipped:
            return "skipped"
        if not self.seconds:
            return "failed"
        return f"ok ({len(self.seconds)}/{len(self.seconds) + len(self.errors)})" if self.errors else "ok"


def _median_int(values: list[int]) -> int | None:
    return int(statistics.median(values)) if values else None


def summarize(name: str, label: str, reps: list[list[dict[str, Any]]], skipped: str | None = None) -> PathSummary:
    """Fold the repetitions of one path (each a list of per-rank records) into a summary."""
    summary = PathSummary(name, label, skipped=skipped)
    for records in reps:
        failed = [r for r in records if not r.get("ok")]
        if failed:
            summary.errors.extend(f"rank {r.get('rank', 0)} ({r.get('stage', '?')}): {r.get('error')}"
                                  for r in failed)
            continue
        summary.seconds.append(max(r["load_seconds"] for r in records))
        summary.import_seconds.append(max(r["import_seconds"] for r in records))
        summary.peak_rss.append(max(r["peak_rss_bytes"] for r in records))
        summary.baseline_rss.append(max(r["baseline_rss_bytes"] for r in records))
        summary.ranks.extend(records)
    return summary


def _fmt_seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _fmt_bytes(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.0f} MiB"


def _ratio(value: float | None, reference: float | None) -> float | None:
    return value / reference if value is not None and reference else None


def acceptance_checks(size: dict[str, Any], summaries: dict[str, PathSummary]) -> list[tuple[str, str, bool | None]]:
    """Issue 6's acceptance criteria for one size: ``(criterion, measured, passed or None if unmeasured)``."""
    checks: list[tuple[str, str, bool | None]] = []
    loader = summaries.get("loader")
    ref = loader.median if loader else None

    def speedup(peer: str, factor: float) -> None:
        other = summaries.get(peer)
        value = _ratio(other.median if other else None, ref)
        shown = "not measured" if value is None else f"{peer} / loader = {value:.2f}"
        checks.append((f"loader ≥ {factor:g}x faster than {peer}", shown,
                       None if value is None else value >= factor))

    speedup("vllm_loop", 4)
    speedup("transformers", 10)
    floor = summaries.get("floor")
    over_floor = _ratio(ref, floor.median if floor else None)
    checks.append(("loader within 1.5x of the floor",
                   "not measured" if over_floor is None else f"loader / floor = {over_floor:.2f}",
                   None if over_floor is None else over_floor <= 1.5))
    loader_rss = _median_int(loader.peak_rss) if loader else None
    peers = [_median_int(summaries[p].peak_rss) for p in ("transformers", "vllm_loop") if p in summaries]
    peers_known = [p for p in peers if p is not None]
    checks.append(("loader peak RSS ≤ each peer's",
                   f"{_fmt_bytes(loader_rss)} vs {', '.join(_fmt_bytes(p) for p in peers_known) or '—'}",
                   None if loader_rss is None or not peers_known else loader_rss <= min(peers_known)))
    baseline = _median_int(loader.baseline_rss) if loader else None
    bound = (size["parameter_bytes"] + size["largest_tensor_bytes"] + baseline) if baseline is not None else None
    checks.append(("loader peak RSS ≤ parameters + largest tensor + baseline",
                   f"{_fmt_bytes(loader_rss)} vs {_fmt_bytes(bound)}",
                   None if loader_rss is None or bound is None else loader_rss <= bound))
    tp = summaries.get("loader_tp2")
    if tp is not None and tp.ranks:
        shares = [r["bytes_read"] / r["checkpoint_bytes"] for r in tp.ranks if r.get("checkpoint_bytes")]
        worst = max(shares) if shares else None
        checks.append(("tp=2: each rank reads ≤ 55 % of tensor bytes",
                       "—" if worst is None else f"max {worst:.1%}", None if worst is None else worst <= 0.55))
    sharded = summaries.get("sharded_tp2")
    if tp is not None or sharded is not None:
        value = _ratio(tp.median if tp else None, sharded.median if sharded else None)
        shown = ("not measured" if value is None or tp is None or sharded is None else
                 f"full {tp.median:.3f} s / sharded {sharded.median:.3f} s = {value:.2f}")
        if sharded is not None and sharded.skipped:
            shown = "skipped: " + sharded.skipped
        checks.append(("tp=2: sharded_state faster than the full checkpoint", shown,
                       None if value is None else value > 1.0))
    return checks


def _main_table(size: dict[str, Any], summaries: dict[str, PathSummary]) -> list[str]:
    loader = summaries.get("loader")
    ref = loader.median if loader else None
    lines = ["| path | median s | min-max s | ÷ loader | GB/s | import s | peak RSS | RSS after import | status |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for s in summaries.values():
        ratio = _ratio(s.median, ref)
        rate = size["parameter_bytes"] / s.median / 1e9 if s.median else None
        spread = f"{min(s.seconds):.3f}-{max(s.seconds):.3f}" if s.seconds else "—"
        imports = statistics.median(s.import_seconds) if s.import_seconds else None
        lines.append(
            f"| {s.label} | {_fmt_seconds(s.median)} | {spread} | "
            f"{'—' if ratio is None else f'{ratio:.2f}'} | {'—' if rate is None else f'{rate:.2f}'} | "
            f"{_fmt_seconds(imports)} | {_fmt_bytes(_median_int(s.peak_rss))} | "
            f"{_fmt_bytes(_median_int(s.baseline_rss))} | {s.status} |")
    return lines


def _rank_table(summaries: dict[str, PathSummary]) -> list[str]:
    rows = [s for s in summaries.values() if s.name.endswith("tp2") and s.ranks]
    if not rows:
        return []
    lines = ["", "Per rank (tp=2, medians over the repetitions):", "",
             "| path | rank | seconds | bytes read | tensor bytes offered | share | peak RSS |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for s in rows:
        for rank in sorted({r.get("rank", 0) for r in s.ranks}):
            mine = [r for r in s.ranks if r.get("rank", 0) == rank]
            seconds = statistics.median(r["load_seconds"] for r in mine)
            read = _median_int([r["bytes_read"] for r in mine if "bytes_read" in r])
            offered = _median_int([r["checkpoint_bytes"] for r in mine if r.get("checkpoint_bytes")])
            share = f"{read / offered:.1%}" if read is not None and offered else "-"
            lines.append(f"| {s.label} | {rank} | {seconds:.3f} | {'-' if read is None else f'{read:,}'} | "
                         f"{'-' if offered is None else f'{offered:,}'} | {share} | "
                         f"{_fmt_bytes(_median_int([r['peak_rss_bytes'] for r in mine]))} |")
    return lines


def _read_paths_section(read_paths: dict[str, Any] | None) -> list[str]:
    if not read_paths:
        return []
    if not read_paths.get("ok", True):
        return ["", "## Read paths (bench_read_paths.py)", "", f"Failed: {read_paths.get('error')}"]
    lines = ["", "## Read paths (bench_read_paths.py)", "",
             f"One {read_paths['bytes'] / 1e9:.2f} GB bf16 file, page cache warm, {read_paths['reps']} "
             f"repetitions in one process, fresh destination each repetition except the reused buffer. "
             f"Command: `{read_paths['command']}`", "",
             "| read path | median s | worst s | GB/s | ÷ reused buffer |", "|---|---:|---:|---:|---:|"]
    for row in read_paths["rows"]:
        lines.append(f"| {row['label']} | {row['median']:.3f} | {max(row['seconds']):.3f} | "
                     f"{row['gb_per_s']:.2f} | {row['vs_floor']:.2f} |")
    lines += ["", f"transparent_hugepage: `{read_paths.get('thp')}`; the advised arena was backed by "
              f"{read_paths.get('huge_pages_backing_bytes', 0) / 2**20:.0f} MiB of huge pages."]
    return lines


def carried_notes(existing: str | None) -> str:
    """The closing note of an existing ``RESULTS.md``, or the placeholder."""
    match = _NOTES.search(existing or "")
    return match.group(1) if match else _DEFAULT_NOTE


def _block(tag: str) -> re.Pattern[str]:
    return re.compile(rf"<!-- {tag} -->\n(.*?)<!-- /{tag} -->\n?", re.S)


def carried_block(existing: str | None, tag: str) -> str | None:
    """The section another benchmark wrote between ``<!-- tag -->`` markers (``bench_fallback.py``), if any."""
    match = _block(tag).search(existing or "")
    return match.group(1) if match else None


def replace_block(existing: str, tag: str, body: str) -> str:
    """``existing`` with its ``tag`` section replaced by ``body`` (added before the closing note if absent)."""
    block = f"<!-- {tag} -->\n{body.rstrip()}\n<!-- /{tag} -->\n"
    if _block(tag).search(existing):
        return _block(tag).sub(lambda _: block, existing, count=1)
    marker = "## Closing note"
    if marker in existing:
        return existing.replace(marker, block + "\n" + marker, 1)
    return existing + ("\n" if existing else "") + block


def render_markdown(results: dict[str, Any], notes: str, extra_blocks: dict[str, str] | None = None) -> str:
    """The whole ``RESULTS.md`` page."""
    meta = results["meta"]
    out = ["# Load benchmarks", "",
           f"- Date: {meta['date']}",
           f"- Machine: {meta['machine']}",
           f"- Software: {meta['software']}",
           f"- Environment: {meta['environment']}",
           f"- Command: `{meta['command']}`",
           f"- Timed process: {meta['process']}",
           f"- Host memory: {meta.get('host_memory', 'not warmed (--no-warm-memory)')} "
           "(first touch of never-used guest memory is several times slower on this VM; see host_memory.py)",
           "",
           "Method: every path runs in a fresh Python process, after untimed warm-up runs (bytecode and "
           "registry caches filled); the order of the paths rotates between "
           "repetitions; the page cache is warmed (every shard read once) before every repetition, so all "
           "figures are warm-cache. Seconds are `time.perf_counter()` around the load alone and end after "
           "one byte of every 4 KiB page of every parameter has been read (a mapped-but-unread file is not "
           "loaded); interpreter start-up and imports are reported separately (`import s`), and every path "
           "collects the imports' garbage (`gc.collect()`) before its clock starts. In a cold "
           "process the timed load includes modules a library imports lazily during its first load; "
           "`--warm-process` loads a tiny checkpoint of the same architecture first, untimed. Peak RSS is "
           "the child's `VmHWM`; under tp=2 the slowest rank's seconds and the largest "
           "rank's RSS are shown. `÷ loader` is the path's median over loader's (above 1: slower than loader). "
           "The floor reads each file into one pre-faulted buffer: a memcpy from the page cache.", ""]
    for size in results["sizes"]:
        summaries: dict[str, PathSummary] = size["summaries"]
        out += [f"## {size['gigabytes']:g} GB checkpoint",
                "",
                f"`{size['folder']}`: Llama (hidden {size['shape']['hidden']}, {size['shape']['layers']} "
                f"layers, vocab {size['shape']['vocab']}), {size['parameter_bytes'] / 1e9:.3f} GB of bf16 "
                f"weights in {size['files']} shards, largest tensor {_fmt_bytes(size['largest_tensor_bytes'])}; "
                f"{size['reps']} repetitions per path.", ""]
        out += _main_table(size, summaries)
        out += _rank_table(summaries)
        out += ["", "Acceptance (issue 6):", "", "| criterion | measured | result |", "|---|---|---|"]
        for criterion, measured, passed in acceptance_checks(size, summaries):
            verdict = "—" if passed is None else "pass" if passed else "**fail**"
            out.append(f"| {criterion} | {measured} | {verdict} |")
        problems = [(s.label, e) for s in summaries.values() for e in s.errors]
        problems += [(s.label, f"skipped: {s.skipped}") for s in summaries.values() if s.skipped]
        if problems:
            out += ["", "Failures and skips:", ""]
            out += [f"- {label}: {error}" for label, error in problems]
        out.append("")
    out += _read_paths_section(results.get("read_paths"))
    if results.get("plot"):
        out += ["", f"![seconds per path]({results['plot']})"]
    for tag, body in (extra_blocks or {}).items():
        out += ["", f"<!-- {tag} -->", body.rstrip("\n"), f"<!-- /{tag} -->"]
    out += ["", "## Closing note", "", "<!-- notes -->", notes.rstrip("\n") + "\n" + "<!-- /notes -->", ""]
    return "\n".join(out)


def section_meta(script: str, argv: list[str], checkpoint: Path, reps: int, repo_root: Path) -> dict[str, str]:
    """Date, machine, software, environment, the command as typed and the checkpoint: what every
    single-purpose benchmark's section (``bench_fallback.py``, ``bench_bin_read.py``) states first."""
    from datetime import UTC, datetime

    from .machine import describe_environment, describe_machine, describe_software

    return {"date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "machine": describe_machine(),
            "software": describe_software(repo_root), "environment": describe_environment(),
            "command": " ".join([f"python benchmarks/{script}", *argv]), "reps": str(reps),
            "checkpoint": str(checkpoint.relative_to(repo_root))}


def show_section(section: str, results: Path | None, tag: str) -> None:
    """Print ``section`` and, given ``results`` (a benchmark's ``--results``), put it between ``tag``'s markers
    there: how a single-purpose benchmark ends."""
    print(section)
    if results is not None:
        write_section(results, tag, section)


def write_section(results: Path, tag: str, section: str) -> None:
    """Put ``section`` between ``tag``'s markers in ``results`` (created if absent)."""
    existing = results.read_text() if results.is_file() else ""
    results.write_text(replace_block(existing, tag, section))
