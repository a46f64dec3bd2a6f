"""Acceptance at tp=2 under ``torchrun``, every case in one launch (a world costs seconds to start): logits
equal the tp=2 safetensors load bit for bit, fp32 and bf16, Llama and tied Qwen2, for tensorizer-written files
(local, moto ``s3://``, HTTP) and loader-written per-rank files (plain and encrypted; local, ``s3://``, HTTP),
each rank reading only its own per-rank file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.torchrun_cases import run_quantized_cases
from tests.plugins.tensorizer.conftest import DTYPES, FAMILIES

WORKER = Path(__file__).with_name("tp_worker.py")


def _cases(checkpoints: dict[str, Path], bucket: str, http: str) -> dict[str, dict[str, Any]]:
    key = {"encryption_keyfile": str(checkpoints["key"])}
    cases: dict[str, dict[str, Any]] = {}
    for family in FAMILIES:
        for dtype in DTYPES:
            name = f"{family}-{dtype}"
            for case, path, options in (
                ("st", str(checkpoints[f"{name}-st"]), None),
                ("tz", str(checkpoints[f"{name}-tz"]), None),
                ("tz-s3", f"s3://{bucket}/{name}-tz/model.tensors", None),
                ("tz-http", f"{http}{name}-tz/model.tensors", None),
                ("tz-enc-http", f"{http}{name}-tz-enc/model.tensors", key),
                ("w2", str(checkpoints[f"{name}-w2"]), None),
                ("w2-enc", str(checkpoints[f"{name}-w2-enc"]), key),
                ("w2-enc-s3", f"s3://{bucket}/{name}-w2-enc/model-rank-%03d.tensors", key),
                ("w2-http", f"{http}{name}-w2/model-rank-%03d.tensors", None),
            ):
                cases[f"{name}-{case}"] = {"path": path, "dtype": dtype, "options": options, "reference": name}
    return cases


@pytest.mark.torchrun
def test_tp2_logits_equal_the_safetensors_load(checkpoints: dict[str, Path], s3_env: str, http_root: str,
                                               tmp_path: Path) -> None:
    cases = _cases(checkpoints, s3_env, http_root)
    out, results = run_quantized_cases(cases, tmp_path, script=WORKER)
    for rank, result in enumerate(results):
        for name, case in cases.items():
            assert "error" not in result[name], (name, result[name])
            if name.endswith("-st"):
                continue
            expected = torch.load(out / f"{case['reference']}-st-rank{rank}.pt")
            assert torch.equal(torch.load(out / f"{name}-rank{rank}.pt"), expected), (name, rank)
            assert result[name]["load_format"] == "tensorizer" and result[name]["tp_size"] == 2
            if "-w2" in name:  # each rank reads only its own per-rank file
                assert result[name]["files"] == [case["path"].replace("%03d", f"{rank:03d}")
                                                 if "%" in case["path"] else
                                                 f"{case['path']}/model-rank-{rank:03d}.tensors"]
