"""The ``<!-- runai -->`` block of RESULTS.md from ``bench_runai.py``'s records: tables, medians, ratios."""

from __future__ import annotations

import re
import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.machine import describe_machine, describe_software
from benchmarks.runner import REPO_ROOT

__all__ = ["render", "write_block"]

BLOCK = re.compile(r"<!-- runai -->\n.*?<!-- /runai -->\n", re.S)
GIB = 2**30


def _median(records: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in records if r.get("ok") and key in r]
    return statistics.median(values) if values else float("nan")


def _by_path(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    paths: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        if "path" in record:
            paths.setdefault(record["path"], []).append(record)
    return paths


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _local_lines(local: list[dict[str, Any]]) -> list[str]:
    paths = _by_path(local)
    lines = ["| path | median s | min-max s | peak RSS | peak / parameter bytes | (peak - baseline) / parameter "
             "bytes | runs ok |", "|---|---:|---:|---:|---:|---:|---:|"]
    for label, rows in paths.items():
        ok = [r for r in rows if r.get("ok")]
        if not ok:
            lines.append(f"| {label} | failed: {rows[0].get('error')} | | | | | 0/{len(rows)} |")
            continue
        params = ok[0]["parameter_bytes"]
        peak = _median(ok, "peak_rss_bytes")
        above = statistics.median(r["peak_rss_bytes"] - r["baseline_rss_bytes"] for r in ok)
        spread = f"{min(r['seconds'] for r in ok):.3f}-{max(r['seconds'] for r in ok):.3f}"
        lines.append(f"| {label} | {_median(ok, 'seconds'):.3f} | {spread} | {peak / GIB:.2f} GiB | "
                     f"{peak / params:.2f}x | {above / params:.2f}x | {len(ok)}/{len(rows)} |")
    medians = {label: _median(rows, "seconds") for label, rows in paths.items()}
    runai = next((v for k, v in medians.items() if k.startswith("runai")), float("nan"))
    alone = next((v for k, v in medians.items() if k.startswith("the streamer")), float("nan"))
    mapped = next((v for k, v in medians.items() if k.startswith("mapped")), float("nan"))
    floor = next((v for k, v in medians.items() if k.startswith("fresh memory")), float("nan"))
    lines += ["", f"Ratios of medians: runai_streamer / streamer alone **{runai / alone:.2f}x** (target <= 1.3), "
              f"runai_streamer / mapped **{runai / mapped:.2f}x** (target <= 2); the fresh-memory floor / mapped "
              f"{floor / mapped:.2f}x, runai_streamer / that floor {runai / floor:.2f}x."]
    return lines


def _s3_lines(s3: list[dict[str, Any]]) -> list[str]:
    paths = _by_path(s3)
    lines = ["| path | median s | min-max s | download s (median) | GETs served | runs ok |",
             "|---|---:|---:|---:|---:|---:|"]
    for label, rows in paths.items():
        ok = [r for r in rows if r.get("ok")]
        if not ok:
            lines.append(f"| {label} | failed: {rows[0].get('error')} | | | | 0/{len(rows)} |")
            continue
        spread = f"{min(r['seconds'] for r in ok):.2f}-{max(r['seconds'] for r in ok):.2f}"
        download = _median(ok, "download_seconds")
        gets = _median(ok, "gets")
        lines.append(f"| {label} | {_median(ok, 'seconds'):.2f} | {spread} | "
                     f"{'' if download != download else f'{download:.2f}'} | "
                     f"{'' if gets != gets else f'{gets:.0f}'} | {len(ok)}/{len(rows)} |")
    ratios = []
    for label, rows in paths.items():
        if label.startswith("streamer, concurrency "):
            c = label.rsplit(" ", 1)[1]
            peer = paths.get(f"boto3 download ({c} at once) + mapped load", [])
            ratios.append(f"concurrency {c}: **{_median(rows, 'seconds') / _median(peer, 'seconds'):.2f}x**")
    lines += ["", "Streamer / boto3 download-then-load, medians (target <= 1): " + ", ".join(ratios) + "."]
    return lines


def _tp_lines(tp: dict[str, Any] | None) -> list[str]:
    if tp is None:
        return []
    if not tp.get("ok"):
        return ["", f"tp=2 from `s3://`: failed: {tp.get('error')}"]
    ranks = tp["ranks"]
    total = tp["checkpoint_bytes"]
    per_rank = ", ".join(f"rank {r['tp_rank']} read {r['bytes_read'] / 1e6:.1f} MB ({r['bytes_read'] / total:.3f} of "
                         f"the files)" for r in ranks)
    return ["", f"tp=2 from `s3://` (one `torchrun` load, bf16, a {total / 1e9:.2f} GB checkpoint): {per_rank}; "
            f"the server sent "
            f"{tp['served'] / 1e6:.1f} MB for the weight files ({tp['served'] / total:.3f} of their "
            f"{total / 1e6:.1f} MB; the ranks' reads plus each rank's headers: "
            f"{(tp['served'] - sum(r['bytes_read'] for r in ranks)) / 1e3:.1f} kB)."]


def render(local: list[dict[str, Any]], s3: list[dict[str, Any]], command: str, load_average: tuple[float, ...],
           when: datetime, seconds: float) -> str:
    tp = next((r for r in s3 if r.get("kind") == "tp2"), None)
    lines = ["<!-- runai -->", "### Run:ai streamer", "",
             f"- Date: {when:%Y-%m-%d %H:%M} UTC; the run took {seconds:.0f} s",
             f"- Machine: {describe_machine()}; load average at start "
             f"{'/'.join(f'{v:.2f}' for v in load_average)} (1/5/15 min)",
             f"- Software: {describe_software(REPO_ROOT)}, runai-model-streamer {_version('runai-model-streamer')}, "
             f"moto {_version('moto')}",
             f"- Command: `{command}`", "",
             "Local 1 GB-class bf16 Llama, warm page cache, each run a fresh process, clock ends after every "
             "parameter page was touched (the streamer alone: after its last tensor); baseline = RSS after the "
             "imports:", "", *_local_lines([r for r in local if r.get("kind") == "local"])]
    if s3:
        lines += ["", f"`s3://` on moto (127.0.0.1), {s3[0].get('parameter_bytes', 0) / 1e9:.2f} GB checkpoint, each "
                  "load a fresh process:", "", *_s3_lines([r for r in s3 if r.get("kind") == "s3"]), *_tp_lines(tp)]
    return "\n".join(lines) + "\n<!-- /runai -->\n"


def write_block(results: Path, block: str) -> None:
    """Replace the runai block in the carried notes, or add it at their end."""
    text = results.read_text() if results.is_file() else ""
    if BLOCK.search(text):
        text = BLOCK.sub(lambda _: block, text)
    elif "<!-- /notes -->" in text:
        text = text.replace("<!-- /notes -->", block + "<!-- /notes -->")
    else:
        text += "\n" + block
    results.write_text(text)
