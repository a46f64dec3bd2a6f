"""The child processes of ``bench_runai.py``: each measures one path in a fresh interpreter and writes JSON.

``python -m benchmarks.runai_children KIND ARGS... RESULT``:

- ``load SOURCE FORMAT OPTIONS_JSON``: ``loader.load_model_with_report`` (bf16), clock ended after every
  parameter page was touched;
- ``alone FOLDER``: the Run:ai streamer used alone (``SafetensorsStreamer`` with its defaults), every tensor
  yielded and dropped, nothing loaded: what the streamer costs by itself;
- ``fresh BYTES``: that many bytes of fresh memory written by torch from a resident buffer, nothing read: the
  floor of any load that copies into parameter memory;
- ``download SOURCE THREADS``: boto3 downloads every object of the ``s3://`` prefix into a temporary folder
  (``THREADS`` objects at once, each with boto3's own multipart concurrency), then the folder is loaded
  mapped: the peer a user of ``s3://`` compares the streamer with;
- ``tp SOURCE`` under ``torchrun``: this rank's load; RESULT holds ``{rank}``;
- ``serve -``: a moto S3 server on a free port of 127.0.0.1, answering lines on stdin (``endpoint``, ``reset``,
  ``counts``: the body bytes sent per ``bucket/key`` as JSON; ``gets``: the GETs answered per key) until stdin
  closes; nothing else is imported, and the heap is frozen for the garbage collector, so the server's Python
  serves requests as fast as it can.

Every child reports ``seconds``, ``bytes_read`` and ``peak_rss_bytes`` (``VmHWM``) and ``baseline_rss_bytes``
(RSS once the imports are done, before the timed work).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

__all__ = ["main"]


def _imports() -> int:
    """What a server imports once; returns the RSS after it (the baseline)."""
    import boto3  # noqa: F401
    import runai_model_streamer  # noqa: F401
    import torch  # noqa: F401

    from benchmarks.measure import rss_breakdown
    from loader import load_model_with_report  # noqa: F401
    from loader._pipeline import load  # noqa: F401

    gc.collect()
    return rss_breakdown().get("rss_bytes", 0)


def _load(source: str, load_format: str, options: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.measure import touch_pages
    from loader import load_model_with_report

    start = time.perf_counter()
    model, report = load_model_with_report(source, dtype="bfloat16", load_format=load_format,
                                           format_options=options or None)
    touch_pages(model)
    return {"seconds": time.perf_counter() - start, "bytes_read": report.bytes_read,
            "parameter_bytes": report.parameter_bytes, "load_format": report.load_format,
            "tp_rank": report.tp_rank}


def _alone(folder: str) -> dict[str, Any]:
    from runai_model_streamer import SafetensorsStreamer

    files = sorted(str(p) for p in Path(folder).glob("*.safetensors"))
    start = time.perf_counter()
    fetched = 0
    with SafetensorsStreamer() as streamer:
        streamer.stream_files(files, device="cpu", owned=False)
        for _, tensor in streamer.get_tensors():
            fetched += tensor.numel() * tensor.element_size()
    return {"seconds": time.perf_counter() - start, "bytes_read": fetched}


def _fresh(nbytes: int) -> dict[str, Any]:
    """``nbytes`` of fresh memory written by torch's threads from a resident 64 MiB source: what any load that
    copies into parameter memory pays at least, on this machine, now."""
    import torch

    source = torch.ones(64 << 20, dtype=torch.uint8)
    start = time.perf_counter()
    fresh = torch.empty(nbytes, dtype=torch.uint8)
    whole, rest = divmod(nbytes, source.numel())
    if whole:
        fresh[:whole * source.numel()].view(whole, -1).copy_(source.view(1, -1).expand(whole, -1))
    fresh[whole * source.numel():].copy_(source[:rest])
    return {"seconds": time.perf_counter() - start, "bytes_read": 0}


def _download(source: str, threads: int) -> dict[str, Any]:
    import boto3

    bucket, _, prefix = source.removeprefix("s3://").partition("/")
    client = boto3.client("s3")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        keys = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix.rstrip("/") + "/", Delimiter="/") for item in page.get("Contents", [])]
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(lambda key: client.download_file(bucket, key, os.path.join(folder, key.rsplit("/", 1)[1])),
                          keys))
        downloaded = time.perf_counter() - start
        record = _load(folder, "auto", {})
    return {**record, "seconds": time.perf_counter() - start, "download_seconds": downloaded}


def _serve() -> None:
    from tests.helpers.s3_server import CountingMotoServer

    server = CountingMotoServer()
    server.start()
    gc.freeze()
    answers = {"endpoint": lambda: server.endpoint, "reset": lambda: server.reset_counts() or "ok",
               "counts": lambda: json.dumps(dict(server.bytes_served)),
               "gets": lambda: json.dumps(dict(server.gets))}
    for line in sys.stdin:
        print(answers[line.strip()](), flush=True)
    server.stop()


def main(argv: list[str]) -> int:
    kind, *args, result = argv
    if kind == "serve":
        _serve()
        return 0
    baseline = _imports()
    if kind == "load":
        record = _load(args[0], args[1], json.loads(args[2]))
    elif kind == "alone":
        record = _alone(args[0])
    elif kind == "fresh":
        record = _fresh(int(args[0]))
    elif kind == "download":
        record = _download(args[0], int(args[1]))
    elif kind == "tp":
        record = _load(args[0], "auto", {})
        result = result.replace("{rank}", os.environ.get("RANK", "0"))
    else:
        raise SystemExit(f"unknown child kind {kind!r}")
    from benchmarks.measure import peak_rss_bytes

    record.update(peak_rss_bytes=peak_rss_bytes(), baseline_rss_bytes=baseline)
    Path(result).write_text(json.dumps(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
