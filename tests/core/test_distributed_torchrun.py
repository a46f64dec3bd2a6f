"""Two real ranks over gloo: sharded layers give the single-process result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent / "scripts" / "tp_layers.py"


@pytest.mark.torchrun
def test_two_ranks_match_single_process(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(SCRIPT), str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert sorted(r["rank"] for r in results) == [0, 1]
    for r in results:
        assert r["size"] == 2
        assert max(r["errors"].values()) <= 1e-5, r
        shapes = r["shapes"]
        assert shapes["gate_up"] == [24, 16] and shapes["down"] == [16, 12]
        assert shapes["qkv"] == [8 + 4 + 4, 16] and shapes["kv_replicas"] == 2
        assert shapes["embed"] == [64, 16] and shapes["logits"] == [2, 3, 70]
        # each rank read only its 12 input columns of down_proj, once
        assert shapes["down_reads"] == [[[0, 16], [12 * r["rank"], 12]]]
