"""Run:ai streamer benchmarks: a local load against the streamer alone and the mapped load; ``s3://`` against
boto3 download-then-load on moto; the bytes each tensor-parallel rank fetches, counted at the server.

``python benchmarks/bench_runai.py`` (defaults: ``--size 1 --reps 5 --s3-gb 0.25 --concurrency 4,8 --s3-reps 3``);
every measurement is a fresh process (:mod:`benchmarks.runai_children`), paths alternate in order, medians:

- **local** (warm page cache): the safetensors plugin (pages mapped), ``load_format="runai_streamer"`` (the
  streamer writing into the parameters), the streamer used alone (its ``SafetensorsStreamer``, nothing
  loaded), and the fresh-memory floor (as many bytes as the parameters written into fresh memory by torch from a
  resident buffer, nothing read: no path that copies into parameters can beat it); peak RSS against the
  parameter bytes, whole and above the post-import baseline;
- **s3**: the ``--s3-gb`` checkpoint on a moto server (a lean process of its own on 127.0.0.1: moto serves each
  request in Python, and in a process holding torch its garbage collector alone halved its throughput),
  loaded through the streamer at each ``--concurrency`` and by boto3 downloading the objects (as many at once as
  the concurrency) into a temporary folder that is then loaded mapped; then a tp=2 ``torchrun`` load, with the
  bytes the server sent for the weight files against what each rank reports it read.

moto answers each ranged GET by copying the whole object in Python first, under a lock per object, so S3 figures
measure moto more than either client (each client's GETs served are counted); the comparison is between clients
on the same server. Results replace the ``<!-- runai -->``
block inside ``RESULTS.md``'s carried notes; raw records go to ``out/runai-last-run.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_runai_report import render, write_block
from benchmarks.checkpoints import ensure_checkpoint, shard_files, warm_page_cache
from benchmarks.runner import REPO_ROOT, child_env

BENCH_DIR = Path(__file__).resolve().parent
LOCAL_PATHS: dict[str, list[str]] = {
    "mapped (safetensors plugin, auto)": ["load", "{folder}", "auto", "{{}}"],
    "runai_streamer (into the parameters)": ["load", "{folder}", "runai_streamer", "{{}}"],
    "the streamer alone (nothing loaded)": ["alone", "{folder}"],
    "fresh memory floor (the parameter bytes written, nothing read)": ["fresh", "{parameter_bytes}"],
}


def _child(args: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    result = BENCH_DIR / "out" / "runai-child.json"
    result.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "benchmarks.runai_children", *args, str(result)], cwd=REPO_ROOT,
                          env=env or child_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not result.is_file():
        return {"ok": False, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return {"ok": True, **json.loads(result.read_text())}


def _bench_local(size: float, reps: int) -> list[dict[str, Any]]:
    folder, shape, _ = ensure_checkpoint(BENCH_DIR / "out", size)
    records = []
    for rep in range(reps):
        for label in list(LOCAL_PATHS) if rep % 2 == 0 else list(LOCAL_PATHS)[::-1]:
            warm_page_cache(shard_files(folder))
            args = [a.format(folder=folder, parameter_bytes=shape.parameter_bytes) for a in LOCAL_PATHS[label]]
            record = _child(args)
            records.append({"kind": "local", "path": label, "parameter_bytes": shape.parameter_bytes, **record})
            print(f"local {label}: {record.get('seconds', record.get('error'))}", flush=True)
    return records


class _Server:
    """``benchmarks.runai_children serve`` in its own process; asked for its byte counts over stdin."""

    def __init__(self) -> None:
        self._process = subprocess.Popen([sys.executable, "-m", "benchmarks.runai_children", "serve", "-"],
                                         cwd=REPO_ROOT, env=child_env(), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True)
        self.endpoint = self._ask("endpoint")

    def _ask(self, command: str) -> str:
        assert self._process.stdin is not None and self._process.stdout is not None
        self._process.stdin.write(command + "\n")
        self._process.stdin.flush()
        return self._process.stdout.readline().strip()

    def reset_counts(self) -> None:
        self._ask("reset")

    def bytes_served(self) -> dict[str, int]:
        return dict(json.loads(self._ask("counts")))

    def gets_served(self) -> int:
        """GETs answered since the last reset, every object's together."""
        return sum(json.loads(self._ask("gets")).values())

    def stop(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=60)


def _bench_s3(size: float, concurrencies: list[int], reps: int, tp_size: float) -> list[dict[str, Any]]:
    import boto3

    from tests.helpers.s3_server import s3_environment, upload_folder

    folder, shape, _ = ensure_checkpoint(BENCH_DIR / "out", size)
    server = _Server()
    records: list[dict[str, Any]] = []
    try:
        env = {**child_env(), **s3_environment(server.endpoint)}
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="bench")
        upload_folder(client, folder, "bench", "llama")
        runs = [(f"streamer, concurrency {c}", ["load", "s3://bench/llama", "auto", json.dumps({"concurrency": c})])
                for c in concurrencies]
        runs += [(f"boto3 download ({c} at once) + mapped load", ["download", "s3://bench/llama", str(c)])
                 for c in concurrencies]
        for rep in range(reps):
            for label, args in runs if rep % 2 == 0 else runs[::-1]:
                server.reset_counts()
                record = _child(args, env)
                record["gets"] = server.gets_served()
                records.append({"kind": "s3", "path": label, "parameter_bytes": shape.parameter_bytes, **record})
                print(f"s3 {label}: {record.get('seconds', record.get('error'))}", flush=True)
        tp_folder, _, _ = ensure_checkpoint(BENCH_DIR / "out", tp_size)
        upload_folder(client, tp_folder, "bench", "tp")
        records.append(_bench_tp2(server, env, tp_folder))
    finally:
        server.stop()
    return records


def _bench_tp2(server: _Server, env: dict[str, str], folder: Path) -> dict[str, Any]:
    """One tp=2 load from ``s3://bench/tp``: what each rank read, and what the server sent for the weights.

    A row-parallel shard is one range per row (S3 has no multi-range GET), so a rank sends thousands of small
    GETs; moto needs more than the streamer's 1 s request timeout for them, and a checkpoint smaller than the
    S3 one (``--tp-gb``) to finish in seconds.
    """
    server.reset_counts()
    pattern = BENCH_DIR / "out" / "runai-tp-{rank}.json"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "benchmarks.runai_children", "tp", "s3://bench/tp", str(pattern)],
                          cwd=REPO_ROOT, env={**env, "OMP_NUM_THREADS": "1", "RUNAI_STREAMER_S3_TIMEOUT": "30000"},
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "Error" in line]
        return {"kind": "tp2", "ok": False, "error": errors[-1:]}
    ranks = [json.loads(Path(str(pattern).format(rank=r)).read_text()) for r in range(2)]
    shards = shard_files(folder)
    counts = server.bytes_served()
    served = sum(counts.get(f"bench/tp/{p.name}", 0) for p in shards)
    return {"kind": "tp2", "ok": True, "ranks": ranks, "served": served,
            "checkpoint_bytes": sum(p.stat().st_size for p in shards)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=float, default=1.0, help="local checkpoint size in GB (default 1)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--s3-gb", type=float, default=0.25, help="checkpoint size for S3 (0: skip S3)")
    parser.add_argument("--concurrency", default="4,8", help="S3 concurrencies (default 4,8)")
    parser.add_argument("--s3-reps", type=int, default=3)
    parser.add_argument("--tp-gb", type=float, default=0.05, help="checkpoint size for the tp=2 load from S3")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = parser.parse_args(argv)
    load_average = os.getloadavg()
    started = time.perf_counter()
    local = _bench_local(args.size, args.reps)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    s3 = _bench_s3(args.s3_gb, concurrencies, args.s3_reps, args.tp_gb) if args.s3_gb else []
    (BENCH_DIR / "out" / "runai-last-run.json").write_text(json.dumps({"local": local, "s3": s3}, indent=1))
    command = ("python benchmarks/bench_runai.py " + shlex.join(argv)).strip()
    write_block(args.results, render(local, s3, command, load_average, datetime.now(UTC),
                                     time.perf_counter() - started))
    return 1 if [r for r in local + s3 if not r.get("ok")] else 0


if __name__ == "__main__":
    raise SystemExit(main())
