"""tp=2 under ``torchrun``: each rank fetches only its shard's bytes (counted at the server) and its logits equal
the mapped tp=2 load's, from ``s3://`` and from a local folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from loader._sharded.save import save_sharded
from tests.helpers.malformed import data_start
from tests.helpers.s3_server import CountingMotoServer, upload_folder

ROOT = Path(__file__).resolve().parents[3]
WORKER = ROOT / "tests" / "e2e" / "scripts" / "sharded_worker.py"


def _torchrun(source: str, load_format: str, prefix: Path) -> list[tuple[torch.Tensor, dict[str, Any]]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(WORKER), source, load_format, str(prefix)],
                          env=env, timeout=300, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return [(torch.load(f"{prefix}-rank{r}.pt"), json.loads(Path(f"{prefix}-rank{r}.json").read_text()))
            for r in range(2)]


@pytest.mark.torchrun
def test_tp2_from_s3_matches_the_local_tp2_load(llama_checkpoint: Path, tmp_path: Path, s3_client: Any,
                                                bucket: str, s3_env: CountingMotoServer) -> None:
    upload_folder(s3_client, llama_checkpoint, bucket, "m")
    s3_env.reset_counts()
    remote = _torchrun(f"s3://{bucket}/m", "auto", tmp_path / "s3")
    local = _torchrun(str(llama_checkpoint), "auto", tmp_path / "local")
    for (a, report_remote), (b, report_local) in zip(remote, local, strict=True):
        assert torch.equal(a, b)
        assert report_remote["load_format"] == "runai_streamer" and report_remote["tp_size"] == 2
        assert report_remote["parameter_bytes"] == report_local["parameter_bytes"]
        assert report_remote["parameter_bytes"] < 0.6 * report_remote["checkpoint_bytes"]
        assert report_remote["bytes_read"] < 0.6 * report_remote["checkpoint_bytes"]  # its shard, not the files
    shards = sorted(llama_checkpoint.glob("*.safetensors"))
    served = sum(s3_env.bytes_served[f"{bucket}/m/{shard.name}"] for shard in shards)
    headers = sum(data_start(shard) for shard in shards)  # each rank reads each header once before streaming
    assert served == sum(report["bytes_read"] for _, report in remote) + 2 * headers


@pytest.mark.torchrun
def test_tp2_local_stream_matches_the_mapped_tp2_load(llama_checkpoint: Path, tmp_path: Path) -> None:
    streamed = _torchrun(str(llama_checkpoint), "runai_streamer", tmp_path / "streamed")
    mapped = _torchrun(str(llama_checkpoint), "auto", tmp_path / "mapped")
    for (a, report), (b, _) in zip(streamed, mapped, strict=True):
        assert torch.equal(a, b)
        assert report["load_format"] == "runai_streamer" and report["bytes_read"] < 0.6 * report["checkpoint_bytes"]


@pytest.mark.torchrun
def test_tp2_sharded_state_from_s3_fetches_one_object_per_rank(
    llama_checkpoint: Path, tmp_path: Path, s3_client: Any, bucket: str, s3_env: CountingMotoServer
) -> None:
    save_sharded(str(llama_checkpoint), tmp_path / "tp2", tp_size=2, dtype="float32")
    upload_folder(s3_client, tmp_path / "tp2", bucket, "tp2")
    s3_env.reset_counts()
    remote = _torchrun(f"s3://{bucket}/tp2", "runai_streamer_sharded", tmp_path / "s3")
    local = _torchrun(str(tmp_path / "tp2"), "sharded_state", tmp_path / "local")
    for rank, ((a, report), (b, _)) in enumerate(zip(remote, local, strict=True)):
        assert torch.equal(a, b)
        assert report["files"] == [f"s3://{bucket}/tp2/model-rank-{rank}-part-0.safetensors"]
    for rank in range(2):
        key = f"{bucket}/tp2/model-rank-{rank}-part-0.safetensors"
        path = tmp_path / "tp2" / key.rsplit("/", 1)[1]
        assert s3_env.bytes_served[key] == path.stat().st_size  # every byte once, see test_sharded
        assert s3_env.gets[key] >= 1
