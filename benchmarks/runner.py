"""Launch one measurement in fresh processes (``python`` or ``torchrun``) and collect its JSON.

Parent side of :mod:`benchmarks.measure`: one child per path (one per rank
under tp), a timeout, and every failure (crash, timeout, missing result)
turned into a record with ``ok: false`` and the error, never an exception.
:func:`json_child` is the single-purpose benchmarks' plainer launcher: one fresh Python child whose last
line of output is its JSON record, and an exception naming the child when it fails.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .paths import MeasuredPath

__all__ = ["REPO_ROOT", "child_env", "json_child", "run_path"]

REPO_ROOT = Path(__file__).resolve().parent.parent


def child_env(pycache: Path | None = None) -> dict[str, str]:
    """The parent's environment with the repository root importable (``benchmarks.*``).

    With ``pycache``, bytecode is cached there (``PYTHONPYCACHEPREFIX``) even when
    ``PYTHONDONTWRITEBYTECODE`` is set: otherwise every fresh child recompiles the
    editable loader sources (~0.2 s here) while site-packages come precompiled,
    which would charge loader for an artefact of the development install.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env.setdefault("PYTHONPYCACHEPREFIX", str(pycache))
    return env


def json_child(command: list[str], env: Mapping[str, str] | None = None, *,
               timeout: float | None = None) -> dict[str, Any]:
    """Run ``command`` (from the repository root, the parent's environment updated with ``env``, bytecode
    cached as in an install) and return the JSON object its last line of output holds.

    :raises RuntimeError: naming the child's last argument and ending its stderr, when it exits non-zero.
    """
    full = {**os.environ, **(env or {})}
    full.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode cached as in an install, not compiled in every child
    done = subprocess.run(command, env=full, cwd=REPO_ROOT, capture_output=True, text=True, check=False,
                          timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command[-1]} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    record: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return record


def _command(path: MeasuredPath, source: Path, result_template: str, warm: Path | None) -> list[str]:
    child = ["-m", "benchmarks.measure", path.name, str(source), result_template]
    if warm is not None:
        child.append(str(warm))
    if path.tp == 1:
        return [sys.executable, *child]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={path.tp}",
            "--no-python", sys.executable, *child]


def _tail(text: str, lines: int = 6) -> str:
    return " | ".join(line for line in text.strip().splitlines()[-lines:] if line.strip())


def _stop(child: subprocess.Popen[str], tmp: Path) -> None:
    """Stop a timed-out child: SIGTERM to its group (torchrun forwards it to the ranks), then SIGKILL
    to the group and to every rank by the pid it recorded (torchrun starts ranks in sessions of their own,
    so killing torchrun alone leaves them running, blocked on its store)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    for pid_file in tmp.glob("rank*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def run_path(path: MeasuredPath, source: Path, timeout: float, pycache: Path | None = None,
             warm: Path | None = None) -> list[dict[str, Any]]:
    """Run ``path`` on ``source`` in fresh process(es); one record per rank, failures included.

    ``warm``: a tiny checkpoint each child loads once, untimed, first (a warm process).
    """
    with tempfile.TemporaryDirectory(prefix=f"bench-{path.name}-") as tmp:
        template = str(Path(tmp) / "rank{rank}.json")
        error = ""
        # A session of its own, so a timeout can stop torchrun *and* its ranks (its process group).
        with subprocess.Popen(_command(path, source, template, warm), cwd=REPO_ROOT, env=child_env(pycache),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) as child:
            try:
                stdout, stderr = child.communicate(timeout=timeout)
                if child.returncode != 0:
                    error = f"exit status {child.returncode}: {_tail(stderr or stdout)}"
            except subprocess.TimeoutExpired:
                _stop(child, Path(tmp))
                child.communicate()
                error = f"timed out after {timeout:.0f} s"
        records = []
        for rank in range(path.tp):
            result = Path(template.replace("{rank}", str(rank)))
            if result.is_file():
                records.append(json.loads(result.read_text()))
            else:
                records.append({"path": path.name, "rank": rank, "ok": False, "stage": "process",
                                "error": error or "the child wrote no result"})
    return records


def measure_rotating(paths: list[MeasuredPath], source: Path, files: list[Path], reps: int, out_dir: Path,
                     timeout: float = 600) -> dict[str, dict[str, Any]]:
    """Each path ``reps`` times after one untimed warm-up, the order rotating, the page cache warmed before
    every run; per path: label, seconds, peak RSS, growth over the RSS after import, and the errors.

    The single-purpose benchmarks (``bench_fallback.py``, ``bench_bin_read.py``) share it, so their rows
    follow the same rules as ``run_all.py``'s.
    """
    from .checkpoints import warm_page_cache

    pycache = out_dir / "pycache"
    for path in paths:
        run_path(path, source, timeout, pycache)  # warm-up: bytecode and registry caches
    records: dict[str, list[dict[str, Any]]] = {path.name: [] for path in paths}
    for rep in range(reps):
        shift = rep % len(paths)
        for path in paths[shift:] + paths[:shift]:
            warm_page_cache(files)
            records[path.name].extend(run_path(path, source, timeout, pycache))
    summary: dict[str, dict[str, Any]] = {}
    for path in paths:
        runs = records[path.name]
        good = [r for r in runs if r.get("ok")]
        summary[path.name] = {
            "label": path.label,
            "seconds": [r["load_seconds"] for r in good],
            "peak_rss": [r["peak_rss_bytes"] for r in good],
            "growth": [r["peak_rss_bytes"] - r["baseline_rss_bytes"] for r in good],
            "errors": [r.get("error") for r in runs if not r.get("ok")],
        }
    return summary
