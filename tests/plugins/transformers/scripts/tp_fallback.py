"""Run under ``torchrun``: load each checkpoint through the fallback, save this rank's logits and figures.

Usage: ``python -m torch.distributed.run --nproc-per-node N tests/plugins/transformers/scripts/tp_fallback.py
OUT CKPT...``. Writes ``OUT/rank<R>.json`` mapping each checkpoint to ``{"logits": file, "bytes_read": ...,
"checkpoint_bytes": ..., "tp_size": ...}`` or ``{"error": "Type: message"}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from loader._pipeline.load import load_model_with_report
from loader.errors import LoadError
from tests.helpers.torchrun_exit import exit_rank

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64], [5, 6, 7, 8, 9, 10, 11, 12]])


def main(out: Path, checkpoints: list[str]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, dict[str, object]] = {}
    for i, checkpoint in enumerate(checkpoints):
        try:
            model, report = load_model_with_report(checkpoint, dtype="float32", model_impl="transformers")
        except LoadError as exc:
            results[checkpoint] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        with torch.no_grad():
            logits = model(IDS)
        logits_file = out / f"{i}-rank{rank}.pt"
        torch.save(logits, logits_file)
        results[checkpoint] = {
            "logits": str(logits_file), "bytes_read": report.bytes_read,
            "checkpoint_bytes": report.checkpoint_bytes, "tp_size": report.tp_size,
        }
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
    exit_rank(0)
