"""Run under ``torchrun``: load each case on this rank and save its logits (or its error).

Usage: ``python -m torch.distributed.run --nproc-per-node N tests/plugins/tensorizer/tp_worker.py OUT CASES``
where ``CASES`` is a JSON file ``{name: {"path": ..., "dtype": ..., "options": {...} | null,
"load_format": ... (optional)}}``. Writes ``OUT/<name>-rank<R>.pt`` and ``OUT/rank<R>.json``
(``{name: {"tp_size": N, "load_format": ..., "files": [...]} | {"error": ...}}``). Every rank loads the same
cases in the same order so the forward passes' collectives stay in step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import loader
from loader.errors import LoadError
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_exit import exit_rank


def main(out: Path, cases_file: Path) -> None:
    rank = int(os.environ.get("RANK", "0"))
    results: dict[str, dict[str, object]] = {}
    for name, case in json.loads(cases_file.read_text()).items():
        try:
            model, report = loader.load_model_with_report(case["path"], dtype=case["dtype"],
                                                          load_format=case.get("load_format", "auto"),
                                                          format_options=case["options"])
        except LoadError as exc:
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        with torch.no_grad():
            torch.save(model(random_ids(model.config.vocab_size)), out / f"{name}-rank{rank}.pt")
        results[name] = {"tp_size": report.tp_size, "load_format": report.load_format, "files": list(report.files)}
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    exit_rank(0)
