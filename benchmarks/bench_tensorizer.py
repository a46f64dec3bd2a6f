"""Tensorizer benchmarks (issue 33): the benchmark Llama (bf16) from a ``.tensors`` file through loader, vs
safetensors (mapped) through loader, vs tensorizer's own ``TensorDeserializer`` into a ``transformers`` model —
locally and from ``s3://`` on a moto server — and at tp=2, rank 0 of the per-rank fast path vs rank 0 of the
sharded-state format. Each load in a fresh process (page cache warmed first for local files), the order of the
paths alternating between repetitions; medians, and ratios to tensorizer's deserializer on the same source.

``python benchmarks/bench_tensorizer.py --gb 1 --reps 3`` (add ``--no-s3`` for local files only). The section goes
between the ``<!-- tensorizer -->`` markers of ``benchmarks/RESULTS.md``.

Every clock starts after the imports (torch, transformers, tensorizer, loader: the same in every child), before
the model is built, and stops after every parameter page was touched, so each path's figure is "checkpoint to
ready module". The deserializer's children also report the seconds spent building the
empty ``transformers`` model (``no_init_or_tensor``), to show how much of its total is not reading.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.checkpoints import ensure_checkpoint, shard_files, warm_page_cache
from benchmarks.report import section_meta, write_section
from benchmarks.runner import REPO_ROOT

OUT = Path(__file__).resolve().parent / "out"
TAG = "tensorizer"
DESERIALIZER = "tensorizer's TensorDeserializer"
RUNAI = "safetensors via loader's Run:ai streamer"


def _child(kind: str, source: str) -> None:
    """One timed load in this fresh process; prints ``{"seconds", "build_seconds"?}`` as JSON."""
    import torch
    import transformers
    from tensorizer import TensorDeserializer, stream_io, utils
    from transformers.models.llama import modeling_llama  # noqa: F401  (transformers imports it lazily)

    import loader
    from benchmarks.measure import touch_pages
    from loader.testing import simulated_tp

    record: dict[str, Any] = {}
    start = time.perf_counter()  # after the imports: both paths' libraries are loaded by then
    if kind == "deserializer":
        config = transformers.AutoConfig.from_pretrained(os.environ["BENCH_CONFIG_DIR"])
        with utils.no_init_or_tensor():
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        record["build_seconds"] = time.perf_counter() - start
        if source.startswith("s3://"):
            stream = stream_io.open_stream(source, "rb", s3_endpoint=os.environ["AWS_ENDPOINT_URL"],
                                           s3_access_key_id="testing", s3_secret_access_key="testing",
                                           force_http=True)  # moto's endpoint is plain http
            TensorDeserializer(stream, device="cpu").load_into_module(model)
        else:
            TensorDeserializer(source, device="cpu").load_into_module(model)
    else:
        tp = 2 if kind == "tp2" else 1
        with simulated_tp(0, tp):
            model = loader.load_model(source, dtype="bfloat16")
    touch_pages(model)
    record["seconds"] = time.perf_counter() - start
    print(json.dumps(record))


def _prepare(gb: float) -> tuple[Path, Path, Path, Path]:
    """The safetensors checkpoint, its tensorizer-written twin, the per-rank tp=2 files, the sharded-state tp=2."""
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
    return folder, tz, per_rank, sharded


def _run(kind: str, source: str, env: dict[str, str], warm: list[Path]) -> dict[str, Any]:
    if warm:
        warm_page_cache(warm)
    done = subprocess.run([sys.executable, __file__, "--child", kind, source], capture_output=True, text=True,
                          env=env, cwd=REPO_ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{kind} {source} failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _measure(runs: list[tuple[str, str, str, list[Path]]], env: dict[str, str], reps: int,
             where: str, optional: tuple[str, ...] = ()) -> dict[str, list[dict[str, Any]]]:
    """``runs`` (label, kind, source, files to warm) ``reps`` times, the order reversed every other repetition.

    A run of an ``optional`` label that fails is recorded as failed (its last error line) instead of ending the
    benchmark: those rows are context, not the comparison.
    """
    records: dict[str, list[dict[str, Any]]] = {label: [] for label, *_ in runs}
    for rep in range(reps):
        for label, kind, source, warm in runs if rep % 2 == 0 else runs[::-1]:
            try:
                record = _run(kind, source, env, warm)
            except RuntimeError as exc:
                if label not in optional:
                    raise
                record = {"failed": str(exc).strip().splitlines()[-1]}
                print(f"{where} {label}: failed: {record['failed']}", flush=True)
            else:
                print(f"{where} {label}: {record['seconds']:.3f} s", flush=True)
            records[label].append(record)
    return records


def _local(folder: Path, tz: Path, per_rank: Path, sharded: Path, reps: int,
           env: dict[str, str]) -> tuple[dict[str, list[dict[str, Any]]], dict[str, list[dict[str, Any]]]]:
    tz_files = [tz / "model.tensors"]
    one = _measure([("safetensors (mapped) via loader", "tp1", str(folder), shard_files(folder)),
                    ("tensorizer file via loader", "tp1", str(tz / "model.tensors"), tz_files),
                    (DESERIALIZER, "deserializer", str(tz / "model.tensors"), tz_files)],
                   {**env, "BENCH_CONFIG_DIR": str(tz)}, reps, "local")
    two = _measure([("per-rank tensorizer files, rank 0", "tp2", str(per_rank), sorted(per_rank.glob("*.tensors"))),
                    ("sharded-state, rank 0", "tp2", str(sharded), sorted(sharded.glob("*.safetensors")))],
                   env, reps, "tp=2")
    return one, two


def _s3(folder: Path, tz: Path, reps: int, env: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    import boto3

    from tests.helpers.s3_server import CountingMotoServer, s3_environment, upload_folder

    server = CountingMotoServer()
    server.start()
    try:
        s3_env = {**env, **s3_environment(server.endpoint), "BENCH_CONFIG_DIR": str(tz)}
        client = boto3.client("s3", endpoint_url=server.endpoint, region_name="us-east-1",
                              aws_access_key_id="testing", aws_secret_access_key="testing")
        client.create_bucket(Bucket="bench")
        upload_folder(client, tz, "bench", "tz")
        upload_folder(client, folder, "bench", "st")
        return _measure([("tensorizer file via loader", "tp1", "s3://bench/tz/model.tensors", []),
                         (DESERIALIZER, "deserializer", "s3://bench/tz/model.tensors", []),
                         (RUNAI, "tp1", "s3://bench/st", [])],
                        s3_env, reps, "s3", optional=(RUNAI,))
    finally:
        server.stop()


def _table(records: dict[str, list[dict[str, Any]]], reference: str | None) -> list[str]:
    base = statistics.median(r["seconds"] for r in records[reference]) if reference else None
    head = "| path | median s | runs (s) |" + (" vs deserializer |" if base else "")
    lines = [head, "|---|---|---|" + ("---|" if base else "")]
    for label, all_values in records.items():
        values = [r for r in all_values if "seconds" in r]
        failures = [r["failed"] for r in all_values if "failed" in r]
        if not values:
            lines.append(f"| {label} | failed | {failures[0]} |" + (" |" if base else ""))
            continue
        median = statistics.median(r["seconds"] for r in values)
        runs = ", ".join(f"{r['seconds']:.2f}" for r in values)
        if failures:
            runs += f" ({len(failures)} failed: {failures[0]})"
        builds = [r["build_seconds"] for r in values if "build_seconds" in r]
        if builds:
            runs += f" (model build {statistics.median(builds):.2f} of it)"
        lines.append(f"| {label} | {median:.3f} | {runs} |" + (f" {median / base:.2f}x |" if base else ""))
    return lines


def render(meta: dict[str, str], gb_bytes: int, local: dict[str, list[dict[str, Any]]],
           tp2: dict[str, list[dict[str, Any]]], s3: dict[str, list[dict[str, Any]]] | None) -> str:
    """The ``tensorizer`` section of RESULTS.md."""
    load = "/".join(f"{v:.2f}" for v in os.getloadavg())
    lines = ["## Tensorizer: loader's plugin vs tensorizer's own deserializer (issue 33)", "",
             f"- Date: {meta['date']}", f"- Machine: {meta['machine']}; load average at the end {load}",
             f"- Software: {meta['software']}", f"- Environment: {meta['environment']}",
             f"- Command: `{meta['command']}`", "",
             f"`{meta['checkpoint']}` ({gb_bytes / 1e9:.2f} GB of bf16 parameters), written once by tensorizer's "
             f"`TensorSerializer.write_module` from the `transformers` model; {meta['reps']} repetitions per path, "
             "each a fresh process, order alternating; clock from after the imports (the same in every child) until "
             "every parameter page was touched. Local files: page cache warm.", "", *_table(local, DESERIALIZER), "",
             "tp=2, rank 0 (simulated rank; the other rank's load is the same work): loader's per-rank tensorized "
             "files (`loader save-tensorized -tp 2`) vs the sharded-state format (`loader save-sharded --tp 2`):",
             "", *_table(tp2, None)]
    if s3:
        lines += ["", "`s3://` on a moto server on 127.0.0.1 (in the benchmark's own process; every load a fresh "
                  "client process). moto serves each GET from Python, so these compare clients on one server, not "
                  "S3's speed:", "", *_table(s3, DESERIALIZER)]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--no-s3", action="store_true", help="local files only")
    parser.add_argument("--results", type=Path, default=Path(__file__).resolve().parent / "RESULTS.md")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "SOURCE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(*args.child)
        return 0
    folder, tz, per_rank, sharded = _prepare(args.gb)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    local, tp2 = _local(folder, tz, per_rank, sharded, args.reps, env)
    s3 = None if args.no_s3 else _s3(folder, tz, args.reps, env)
    meta = section_meta("bench_tensorizer.py", argv if argv is not None else sys.argv[1:], folder, args.reps,
                        REPO_ROOT)
    section = render(meta, sum(p.stat().st_size for p in shard_files(folder)), local, tp2, s3)
    write_section(args.results, TAG, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
