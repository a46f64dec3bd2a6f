"""The child process of one measurement: set up, time one path, write JSON.

Run as ``python -m benchmarks.measure PATH SOURCE RESULT [WARM_SOURCE]`` (``RESULT``
may hold ``{rank}``, filled from ``RANK`` under torchrun; ``WARM_SOURCE``, a tiny
checkpoint, makes a warm process: the path loads it once, untimed, before the
timed load, so modules a load imports lazily are already imported). Every path runs in a fresh
interpreter so nothing (allocator state, imported modules, warmed caches in
torch or transformers) leaks between paths.

Three figures per run:

- ``import_seconds``: the path's ``setup`` (imports, plugin discovery, the
  process group, a pre-faulted read buffer): what a long-running program pays
  once, reported but kept out of the load time;
- ``load_seconds``: ``time.perf_counter`` around the path's ``run`` only, which
  ends after every weight page has been touched (:func:`touch_pages`), since a
  mapped-but-unread file is not loaded;
- ``peak_rss_bytes`` (``ru_maxrss``) and ``baseline_rss_bytes`` (RSS after
  setup), plus the anonymous / file-backed split at the end, which tells an
  arena from mapped files.

A path that raises is written as ``{"ok": false, "error": ...}``; the parent
reports it as failed and carries on.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path
from typing import Any

__all__ = ["PAGE_BYTES", "main", "peak_rss_bytes", "rss_breakdown", "touch_pages"]

PAGE_BYTES = 4096


def peak_rss_bytes() -> int:
    """Peak resident set of this process: ``VmHWM``, else ``ru_maxrss`` (KiB on Linux).

    ``VmHWM`` first because ``ru_maxrss`` survives ``exec``: a child inherits the
    peak of the parent it was forked from (the benchmark driver), which would
    inflate small paths like the floor.
    """
    hwm = rss_breakdown().get("hwm_bytes")
    return hwm if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_breakdown() -> dict[str, int]:
    """Current ``VmRSS`` / ``RssAnon`` / ``RssFile`` / ``RssShmem`` and peak ``VmHWM`` in bytes.

    Empty off Linux. ``RssShmem`` is where a ``MAP_SHARED`` anonymous arena lands.
    """
    wanted = {"VmRSS": "rss_bytes", "RssAnon": "rss_anon_bytes", "RssFile": "rss_file_bytes",
              "RssShmem": "rss_shmem_bytes", "VmHWM": "hwm_bytes"}
    found: dict[str, int] = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in wanted:
                    found[wanted[key]] = int(value.split()[0]) * 1024
    except OSError:
        pass
    return found


def touch_pages(module: Any, *, buffers: bool = False) -> int:
    """Read one byte of every 4 KiB page of every parameter (and buffer, with ``buffers``: where quantized
    layers keep packed weights); return the pages touched.

    Forces weights that are still lazily mapped (``mmap`` of the file) to
    become resident inside the timed region: the sum reads every sampled byte
    (torch evaluates eagerly, nothing is skipped). Tied parameters are touched once.
    """
    import itertools

    import torch

    seen: set[int] = set()
    pages = 0
    for param in itertools.chain(module.parameters(), module.buffers() if buffers else ()):
        data = param.detach()
        if data.device.type == "meta" or data.numel() == 0 or data.data_ptr() in seen:
            continue
        seen.add(data.data_ptr())
        if not data.is_contiguous():
            data = data.contiguous()
        raw = data.reshape(-1).view(torch.uint8)[::PAGE_BYTES]
        raw.sum(dtype=torch.int64).item()
        pages += raw.numel()
    return pages


def _result_path(template: str) -> Path:
    return Path(template.replace("{rank}", os.environ.get("RANK", "0")))


def _failure(stage: str, exc: BaseException) -> dict[str, Any]:
    lines = traceback.format_exception_only(type(exc), exc)
    return {"ok": False, "stage": stage, "error": "".join(lines).strip(),
            "traceback": traceback.format_exc()[-4000:]}


def measure(path_name: str, source: Path, warm_source: Path | None = None) -> dict[str, Any]:
    """Set up and time one path in this process; never raises."""
    from .paths import PATHS

    record: dict[str, Any] = {"path": path_name, "rank": int(os.environ.get("RANK", "0")),
                              "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    path = PATHS[path_name]
    start = time.perf_counter()
    try:
        state = path.setup(source)
    except BaseException as exc:
        return {**record, **_failure("setup", exc)}
    # The garbage of importing torch and friends is collected once by any long-running program;
    # left in place, the first full collection lands in whichever path's timed load allocates first.
    gc.collect()
    record["import_seconds"] = time.perf_counter() - start
    if warm_source is not None and path.warm is not None:
        start = time.perf_counter()
        try:
            path.warm(warm_source, state)
        except BaseException as exc:
            return {**record, **_failure("warm-up load", exc)}
        gc.collect()
        record["warm_seconds"] = time.perf_counter() - start
    record["baseline_rss_bytes"] = rss_breakdown().get("rss_bytes", 0)
    start = time.perf_counter()
    try:
        extra = path.run(source, state)
    except BaseException as exc:
        return {**record, **_failure("load", exc)}
    record["load_seconds"] = time.perf_counter() - start
    record["peak_rss_bytes"] = peak_rss_bytes()
    record.update({f"end_{key}": value for key, value in rss_breakdown().items() if key != "hwm_bytes"})
    record.update(extra)
    record["ok"] = True
    return record


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4):
        print("usage: python -m benchmarks.measure PATH SOURCE RESULT_JSON [WARM_SOURCE]", file=sys.stderr)
        return 2
    path_name, source, result = args[:3]
    # The parent kills a timed-out rank by this pid (torchrun's ranks outlive a killed torchrun).
    _result_path(result).with_suffix(".pid").write_text(str(os.getpid()))
    record = measure(path_name, Path(source), Path(args[3]) if len(args) == 4 else None)
    _result_path(result).write_text(json.dumps(record, indent=2) + "\n")
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
