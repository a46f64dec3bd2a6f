"""Run under ``torchrun``: load each FP8 case on this rank and save its logits (or its error).

Usage: ``python -m torch.distributed.run --nproc-per-node N tests/helpers/scripts/tp_fp8_worker.py OUT CASES``
where ``CASES`` is a JSON file ``{name: {"path": ..., "options": {...} | null}}``. Writes ``OUT/<name>-rank<R>.pt``
and ``OUT/rank<R>.json`` (``{name: {"tp_size": N, "kernels": {...}} | {"error": ...}}``). Every rank loads the
same cases in the same order so the forward passes' collectives stay in step.
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


def main(out: Path, cases_file: Path) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, dict[str, object]] = {}
    for name, case in json.loads(cases_file.read_text()).items():
        try:
            model, report = load_model_with_report(case["path"], dtype="float32",
                                                   quantization_options=case["options"])
        except LoadError as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        with torch.no_grad():
            torch.save(model(random_ids(model.config.vocab_size)), out / f"{name}-rank{rank}.pt")
        assert report.quantization is not None
        results[name] = {"tp_size": report.tp_size, "kernels": report.quantization["kernels"]}
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    exit_rank(0)
