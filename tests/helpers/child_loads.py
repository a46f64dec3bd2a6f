"""Run ``tests/helpers/scripts/stream_load.py`` in a child process and read back the state dict or the error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

__all__ = ["child_load"]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "helpers" / "scripts" / "stream_load.py"


def child_load(source: str, dtype: str, out: Path, *extra: str, wrap: list[str] | None = None) -> dict[str, Any]:
    """``{"state": ...}`` or ``{"error": type name, "message": ...}``; ``wrap`` prefixes the command."""
    command = [*(wrap or []), sys.executable, str(SCRIPT), source, dtype, str(out), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    error = out.with_suffix(".json")
    if error.is_file():
        return dict(json.loads(error.read_text()))
    return {"state": torch.load(out.with_suffix(".pt"))}
