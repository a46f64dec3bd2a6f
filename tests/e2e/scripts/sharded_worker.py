"""torchrun worker: load a source on this rank and save logits (+ bytes read) for the parent test."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

import loader
from tests.helpers.torchrun_exit import exit_rank


def main() -> None:
    source, load_format, out_prefix = sys.argv[1], sys.argv[2], sys.argv[3]
    model, report = loader.load_model_with_report(source, dtype="float32", load_format=load_format)
    torch.manual_seed(0)
    ids = torch.randint(0, 256, (2, 9))
    logits = model(ids)
    rank = dist.get_rank()
    torch.save(logits, f"{out_prefix}-rank{rank}.pt")
    with open(f"{out_prefix}-rank{rank}.json", "w") as fh:
        json.dump(report.to_json(), fh)
    dist.barrier()


if __name__ == "__main__":
    main()
    exit_rank(0)
