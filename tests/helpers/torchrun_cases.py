"""Launch ``tests/helpers/scripts/tp_quantized_worker.py`` under ``torchrun`` on a set of checkpoints, once.

The tensor-parallel tests of the quantized formats all do the same: write their checkpoints, list them as
cases, run one ``torchrun`` world over them (one launch for every case: a world costs seconds to start), and
read back each rank's logits or error. This is that launch; each test then compares with its own reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["REPO", "WORKER", "run_quantized_cases"]

REPO = Path(__file__).resolve().parents[2]
WORKER = REPO / "tests" / "helpers" / "scripts" / "tp_quantized_worker.py"


def run_quantized_cases(cases: dict[str, dict[str, Any]], root: Path, *, ranks: int = 2, timeout: int = 300,
                        script: Path = WORKER) -> tuple[Path, list[dict[str, Any]]]:
    """Run ``script`` over ``cases`` (``{name: {"path": ..., "options": ...}}``, see the worker) on ``ranks``
    ranks; return the folder of the ``<name>-rank<R>.pt`` logits and each rank's ``{name: result}``.

    The world's exit status must be 0; its output's tail is the assertion message otherwise.
    """
    cases_file = root / "cases.json"
    cases_file.write_text(json.dumps(cases))
    out = root / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("WORLD_SIZE", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
               str(script), str(out), str(cases_file)]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]
