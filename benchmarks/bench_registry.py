"""How long ``loader models --json`` takes, cold (empty probe cache) and warm, in fresh processes.

Cold: every run gets an empty ``LOADER_CACHE_DIR``, so the registry starts one
probe child that imports every model plugin (and torch). Warm: the cache is
filled once, then every run answers from disk without importing torch. The
issue's targets on a developer machine: cold <= 3 s, warm <= 0.3 s. Bytecode is
compiled once into a temporary ``PYTHONPYCACHEPREFIX`` first (as an installed
package has it), even where ``PYTHONDONTWRITEBYTECODE`` is set. Nothing is
asserted; the table is for the record. Usage::

    .venv/bin/python benchmarks/bench_registry.py [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS_S = {"cold": 3.0, "warm": 0.3}


def models_command() -> list[str]:
    """The installed ``loader`` script, or the registry call it makes when the CLI is missing."""
    script = Path(sys.executable).with_name("loader")
    if script.exists():
        return [str(script), "models", "--json"]
    return [sys.executable, "-c", "from loader._registry import get_registry; get_registry().model_infos()"]


def run_once(command: list[str], cache_dir: Path, pycache: Path) -> float:
    env = {**os.environ, "LOADER_CACHE_DIR": str(cache_dir), "OMP_NUM_THREADS": "1",
           "PYTHONPYCACHEPREFIX": str(pycache)}
    env.pop("LOADER_PROBE_IN_PROCESS", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return elapsed


def measure(command: list[str], repeat: int) -> dict[str, list[float]]:
    root = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    pycache = root / "pycache"
    try:
        run_once(command, root / "priming", pycache)  # compile bytecode once, as an installed package has it
        cold = [run_once(command, root / f"cold-{i}", pycache) for i in range(repeat)]
        warm_dir = root / "warm"
        run_once(command, warm_dir, pycache)  # fill the probe cache
        warm = [run_once(command, warm_dir, pycache) for _ in range(repeat)]
        baseline = [run_once([sys.executable, "-c", "pass"], root / "unused", pycache) for _ in range(repeat)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"cold": cold, "warm": warm, "python startup": baseline}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs per case (default 5)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    command = models_command()
    results = measure(command, args.repeat)
    if args.json:
        print(json.dumps({"command": command, "seconds": results}, indent=1))
        return 0
    print(f"command: {' '.join(command)}   ({args.repeat} fresh processes per case)")
    print(f"{'case':<16}{'median s':>10}{'min s':>10}{'max s':>10}{'target s':>10}")
    for case, times in results.items():
        target = TARGETS_S.get(case)
        target_text = f"{target:.1f}" if target is not None else "-"
        print(f"{case:<16}{statistics.median(times):>10.3f}{min(times):>10.3f}{max(times):>10.3f}{target_text:>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
