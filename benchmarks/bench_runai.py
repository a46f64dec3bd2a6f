"""Run:ai streamer benchmarks (issue 13): local disk vs the safetensors plugin, and S3 throughput against moto.

``python benchmarks/bench_runai.py`` (defaults: ``--sizes 1,4 --reps 3 --concurrency 1,4,16 --s3-gb 0.25``):

- **local**: for each benchmark checkpoint (:mod:`benchmarks.checkpoints`), ``loader.load_model`` with the
  safetensors plugin (``auto``: pages mapped) and with ``load_format="runai_streamer"``, each load in a fresh
  process, the order alternating, the page cache warmed before each; the clock ends after every parameter page
  was touched, as in ``run_all.py``;
- **s3**: the ``--s3-gb`` checkpoint uploaded to a moto server running in a process of its own (so the
  server's Python does not share the loading process's GIL), then loaded from ``s3://`` at each
  ``concurrency``; GB/s is tensor bytes fetched over the load's seconds. moto answers each ranged GET by
  copying the whole object in Python first, so its cost grows with object size times requests: 1 GB
  (250 MB objects) made the streamer's requests time out here, hence 0.25 GB (62 MB objects) by default.

Results replace the ``<!-- runai -->`` block inside ``RESULTS.md``'s carried notes (``run_all.py`` keeps
them), with date, machine, software and this command; raw records go to ``out/runai-last-run.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the ``benchmarks`` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files, warm_page_cache
from benchmarks.machine import describe_environment, describe_machine, describe_software
from benchmarks.runner import REPO_ROOT, child_env

BENCH_DIR = Path(__file__).resolve().parent
LOCAL_PATHS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "safetensors plugin (auto: pages mapped)": ("auto", {}, {}),
    "safetensors plugin, LOADER_MAP_WEIGHTS=0 (copying)": ("auto", {}, {"LOADER_MAP_WEIGHTS": "0"}),
    "runai_streamer (its default: direct I/O)": ("runai_streamer", {}, {}),
    "runai_streamer, fs_strategy=sync_buffered": ("runai_streamer", {"fs_strategy": "sync_buffered"}, {}),
}
"""Label -> (load_format, format_options, environment) of each local path. The copying row is the control:
the streamer path copies every byte into fresh parameter memory too."""
BLOCK = re.compile(r"<!-- runai -->\n.*?<!-- /runai -->\n", re.S)


# --- children -----------------------------------------------------------------------------


def _child_load(source: str, load_format: str, options: dict[str, Any], result: Path) -> None:
    """One timed load in this fresh process; writes seconds, bytes and peak RSS."""
    import gc

    import torch  # noqa: F401

    from benchmarks.measure import peak_rss_bytes, touch_pages
    from loader import load_model_with_report
    from loader._pipeline import load  # noqa: F401

    if load_format.startswith("runai") or source.startswith("s3://"):
        # what a server imports once (0.6 s here); the plugin itself imports them lazily, inside a load
        import boto3  # noqa: F401
        import runai_model_streamer  # noqa: F401
    gc.collect()
    start = time.perf_counter()
    model, report = load_model_with_report(source, dtype="bfloat16", load_format=load_format,
                                           format_options=options or None)
    touch_pages(model)
    seconds = time.perf_counter() - start
    result.write_text(json.dumps({"seconds": seconds, "bytes_read": report.bytes_read,
                                  "load_format": report.load_format, "peak_rss_bytes": peak_rss_bytes()}))


def _child_serve(port: int) -> None:
    """A moto S3 server on 127.0.0.1:``port`` until stdin closes."""
    from tests.helpers.s3_server import CountingMotoServer

    server = CountingMotoServer(port)
    server.start()
    print("ready", flush=True)
    sys.stdin.read()
    server.stop()


# --- parent -------------------------------------------------------------------------------


def _run_child(args: list[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    result = BENCH_DIR / "out" / "runai-child.json"
    result.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-m", "benchmarks.bench_runai", "--child", *args, str(result)],
                          cwd=REPO_ROOT, env=env or child_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not result.is_file():
        return {"ok": False, "error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return {"ok": True, **json.loads(result.read_text())}


def _bench_local(sizes: list[float], reps: int) -> list[dict[str, Any]]:
    records = []
    for size in sizes:
        folder, shape, _ = ensure_checkpoint(BENCH_DIR / "out", size)
        for rep in range(reps):
            for label in list(LOCAL_PATHS) if rep % 2 == 0 else list(LOCAL_PATHS)[::-1]:
                load_format, options, env = LOCAL_PATHS[label]
                warm_page_cache(shard_files(folder))
                record = _run_child(["load", str(folder), load_format, json.dumps(options)], env={**child_env(), **env})
                records.append({"kind": "local", "size_gb": size, "path": label,
                                "parameter_bytes": shape.parameter_bytes, **record})
                print(f"local {size} GB {label}: {record.get('seconds', record.get('error'))}", flush=True)
    return records


def _bench_s3(size: float, concurrencies: list[int], reps: int, chunk: int | None) -> list[dict[str, Any]]:
    import boto3

    from tests.helpers.s3_server import free_port, s3_environment, upload_folder

    folder, shape, _ = ensure_checkpoint(BENCH_DIR / "out", size)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_runai", "--serve", str(port)], cwd=REPO_ROOT,
                              env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    records = []
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        env = {**child_env(), **s3_environment(f"http://127.0.0.1:{port}")}
        client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="bench")
        start = time.perf_counter()
        upload_folder(client, folder, "bench", "llama")
        print(f"uploaded {size} GB in {time.perf_counter() - start:.1f} s", flush=True)
        for rep in range(reps):
            for concurrency in concurrencies if rep % 2 == 0 else concurrencies[::-1]:
                options = {"concurrency": concurrency, **({"chunk_bytesize": chunk} if chunk else {})}
                record = _run_child(["load", "s3://bench/llama", "auto", json.dumps(options)], env=env)
                records.append({"kind": "s3", "size_gb": size, "concurrency": concurrency,
                                "parameter_bytes": shape.parameter_bytes, **record})
                print(f"s3 concurrency {concurrency}: {record.get('seconds', record.get('error'))}", flush=True)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=60)
    return records


def _median(records: list[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in records if r.get("ok")]
    return statistics.median(values) if values else float("nan")


def _render(local: list[dict[str, Any]], s3: list[dict[str, Any]], command: str) -> str:
    lines = ["<!-- runai -->", "### Run:ai streamer (issue 13)", "",
             f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC", f"- Machine: {describe_machine()}",
             f"- Software: {describe_software(REPO_ROOT)}, runai-model-streamer "
             f"{_version('runai-model-streamer')}, moto {_version('moto')}",
             f"- Environment: {describe_environment()}", f"- Command: `{command}`", "",
             "Local disk, warm page cache, each load in a fresh process, clock ends after every parameter page "
             "was touched:", "",
             "| checkpoint | path | median s | min-max s | GB/s | peak RSS | runs ok |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for size in sorted({r["size_gb"] for r in local}):
        for label in LOCAL_PATHS:
            rows = [r for r in local if r["size_gb"] == size and r["path"] == label]
            ok = [r for r in rows if r.get("ok")]
            if not ok:
                lines.append(f"| {size:g} GB | {label} | failed | | | | 0/{len(rows)} |")
                continue
            median = _median(rows, "seconds")
            spread = f"{min(r['seconds'] for r in ok):.3f}-{max(r['seconds'] for r in ok):.3f}"
            gbs = ok[0]["parameter_bytes"] / median / 1e9
            rss = max(r["peak_rss_bytes"] for r in ok) / 2**30
            lines.append(f"| {size:g} GB | {label} | {median:.3f} | {spread} | {gbs:.2f} | {rss:.2f} GiB | "
                         f"{len(ok)}/{len(rows)} |")
    if s3:
        lines += ["", f"`s3://` against moto (its own process on 127.0.0.1), {s3[0]['size_gb']:g} GB checkpoint, "
                  "GB/s = tensor bytes fetched / load seconds (moto copies the whole object for every ranged GET, "
                  "so these figures measure moto more than the streamer):", "",
                  "| concurrency | median s | min-max s | GB/s | runs ok |", "|---:|---:|---:|---:|---:|"]
        for concurrency in sorted({r["concurrency"] for r in s3}):
            rows = [r for r in s3 if r["concurrency"] == concurrency]
            ok = [r for r in rows if r.get("ok")]
            if not ok:
                lines.append(f"| {concurrency} | failed: {rows[0].get('error')} | | | 0/{len(rows)} |")
                continue
            median = _median(rows, "seconds")
            spread = f"{min(r['seconds'] for r in ok):.2f}-{max(r['seconds'] for r in ok):.2f}"
            lines.append(f"| {concurrency} | {median:.2f} | {spread} | {ok[0]['bytes_read'] / median / 1e9:.3f} | "
                         f"{len(ok)}/{len(rows)} |")
    return "\n".join(lines) + "\n<!-- /runai -->\n"


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _write_block(results: Path, block: str) -> None:
    """Replace the runai block in the carried notes, or add it at their end."""
    text = results.read_text() if results.is_file() else ""
    if BLOCK.search(text):
        text = BLOCK.sub(lambda _: block, text)
    elif "<!-- /notes -->" in text:
        text = text.replace("<!-- /notes -->", block + "<!-- /notes -->")
    else:
        text += "\n" + block
    results.write_text(text)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _, _, source, load_format, options, result = argv
        _child_load(source, load_format, json.loads(options), Path(result))
        return 0
    if argv[:1] == ["--serve"]:
        _child_serve(int(argv[1]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,4", help="local checkpoint sizes in GB (default 1,4)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", default="1,4,16", help="S3 concurrencies (default 1,4,16)")
    parser.add_argument("--s3-gb", type=float, default=0.25, help="checkpoint size for S3 (0: skip)")
    parser.add_argument("--s3-chunk", type=int, default=None, help="chunk_bytesize for S3 (default: the streamer's)")
    parser.add_argument("--results", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = parser.parse_args(argv)
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    local = _bench_local(sizes, args.reps)
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    s3 = _bench_s3(args.s3_gb, concurrencies, args.reps, args.s3_chunk) if args.s3_gb else []
    (BENCH_DIR / "out" / "runai-last-run.json").write_text(json.dumps({"local": local, "s3": s3}, indent=1))
    command = "python benchmarks/bench_runai.py " + shlex.join(argv)
    _write_block(args.results, _render(local, s3, command.strip()))
    failed = [r for r in local + s3 if not r.get("ok")]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
