"""Run under ``torchrun``: load checkpoint A, update it with B's full tensors, compare with a fresh load of B.

Usage: ``python -m torch.distributed.run --nproc-per-node N tests/e2e/scripts/tp_update.py OUT A::B...``.
Each rank is given B's full, unsharded tensors (read from B's files: written by ``transformers``, or a GPTQ
checkpoint's packed tensors) and keeps its own shard. Writes ``OUT/rank<R>.json`` mapping each ``A::B`` to
``{"equal": ..., "storage_kept": ..., "version": ..., "tp_size": ...}`` or ``{"error": "Type: message"}``. Every
rank runs the same cases in the same order, so the collectives of the forward passes stay in step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

import loader
from loader.errors import LoadError
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_exit import exit_rank


def _state_dict(folder: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    return tensors


def _storage(model: torch.nn.Module) -> dict[str, int]:
    """Where every parameter and buffer (a packed layer's kernel tensors) keeps its values."""
    return {name: t.data_ptr() for name, t in [*model.named_parameters(), *model.named_buffers()]}


def _case(a: Path, b: Path) -> dict[str, object]:
    model = loader.load_model(str(a), dtype="float32")
    pointers = _storage(model)
    report = loader.update_weights(model, _state_dict(b))
    fresh = loader.load_model(str(b), dtype="float32")
    ids = random_ids(model.config.vocab_size)
    with torch.no_grad():
        updated, expected = model(ids), fresh(ids)
    return {"equal": bool(torch.equal(updated, expected)), "version": report.version,
            "storage_kept": pointers == _storage(model),
            "tp_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1}


def main(out: Path, cases: list[str]) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, dict[str, object]] = {}
    for case in cases:
        a, _, b = case.partition("::")
        try:
            results[case] = _case(Path(a), Path(b))
        except LoadError as exc:
            results[case] = {"error": f"{type(exc).__name__}: {exc}"}
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
    exit_rank(0)
