"""Run under ``torchrun``: load each checkpoint, save this rank's logits and load figures (or its error).

Usage: ``python -m torch.distributed.run --nproc-per-node N tests/e2e/scripts/tp_logits.py OUT CKPT...``;
a checkpoint written ``PATH::ep`` is loaded with ``enable_expert_parallel=True``.
Writes ``OUT/rank<R>.json`` mapping each checkpoint to ``{"logits": file, "bytes_read": ...,
"checkpoint_bytes": ...}`` or ``{"error": "Type: message"}``; logits go to ``OUT/<i>-rank<R>.pt``.
Every rank loads the same checkpoints in the same order, so the collectives of
the forward passes stay in step (a load error is raised on every rank alike).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from loader._pipeline.load import load_model_with_report
from loader.errors import LoadError
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_exit import exit_rank


def main(out: Path, checkpoints: list[str]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, dict[str, object]] = {}
    for i, checkpoint in enumerate(checkpoints):
        path, _, mode = checkpoint.partition("::")
        try:
            model, report = load_model_with_report(path, dtype="float32", enable_expert_parallel=mode == "ep")
        except LoadError as exc:
            results[checkpoint] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        with torch.no_grad():
            logits = model(random_ids(model.config.vocab_size))
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
