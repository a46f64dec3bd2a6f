"""Run under ``torchrun --nproc-per-node 3``: rank 0 trains, ranks 1-2 are a TP=2 inference group it updates.

Usage: ``python -m torch.distributed.run --nproc-per-node 3 tests/e2e/scripts/trainer_update.py OUT ROOT``;
``ROOT/<family>/A`` is the checkpoint the inference ranks load. Rank 0 holds B as a ``transformers`` model and
sends it with ``loader.send_weights``; ranks 1-2 receive it with ``loader.update_weights_from_distributed``,
each keeping its shard. Every rank runs the same cases in the same order (the protocol's collectives take the
whole world; the forward passes' all-reduces only the TP group) and writes ``OUT/rank<R>.json`` mapping each
case to what it saw or ``{"error": "Type: message"}``; logits go to ``OUT/<case>-rank<R>.pt``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import loader
from loader._session import current_session
from loader.errors import LoadError
from tests.helpers.hf_checkpoints import build_model, reference_logits, tiny_config
from tests.helpers.model_checks import random_ids
from tests.helpers.torchrun_exit import exit_rank

TRAINER = 0
BUCKET = 4096  # bytes: several buckets per model, and tensors larger than a bucket, sent alone


def _outcome(action: Callable[..., dict[str, Any]], *args: Any, **options: Any) -> dict[str, Any]:
    try:
        return action(*args, **options)
    except LoadError as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


class Inference:
    """Ranks 1-2: a TP=2 model loaded from A, updated from the trainer."""

    def __init__(self, root: Path, out: Path, rank: int) -> None:
        self.root, self.out, self.rank = root, out, rank
        self.models: dict[str, torch.nn.Module] = {}

    def model(self, family: str) -> torch.nn.Module:
        if family not in self.models:
            self.models[family] = loader.load_model(str(self.root / family / "A"), dtype="float32")
        return self.models[family]

    def save_logits(self, case: str, family: str) -> str:
        with torch.no_grad():
            logits = self.model(family)(random_ids(tiny_config(family).vocab_size))
        path = self.out / f"{case}-rank{self.rank}.pt"
        torch.save(logits, path)
        return str(path)

    def receive(self, case: str, family: str, specs: list[loader.WeightSpec], **options: Any) -> dict[str, Any]:
        model = self.model(family)
        pointers = [p.data_ptr() for p in model.parameters()]
        report = loader.update_weights_from_distributed(model, specs, src=TRAINER, **options)
        return {"logits": self.save_logits(case, family), "version": report.version, "tensors": report.tensors,
                "bytes": report.bytes, "skipped": list(report.skipped), "tp_size": current_session().tp_size,
                "storage_kept": pointers == [p.data_ptr() for p in model.parameters()]}


def _trainer_state(family: str, extra: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    return {**build_model(family, seed=1).state_dict(), **(extra or {})}


def _specs(state: dict[str, torch.Tensor]) -> list[loader.WeightSpec]:
    return list(loader.weight_specs(state))


def _changed(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What a buggy trainer sends: one tensor the wrong shape, one tensor more than announced."""
    return {**state, "model.norm.weight": torch.ones(32), "extra.weight": torch.ones(2)}


UNKNOWN = {"model.layers.0.self_attn.rotary.weight": torch.ones(4)}
# case -> family, what the trainer sends, the specs the receivers get, trainer options, options by receiver rank
CASES: dict[str, tuple[str, Callable[[], dict[str, torch.Tensor]], Callable[[], dict[str, torch.Tensor]],
                       dict[str, Any], dict[int, dict[str, Any]]]] = {
    "llama": ("llama", lambda: _trainer_state("llama"), lambda: _trainer_state("llama"),
              {"bucket_bytes": BUCKET}, {1: {"bucket_bytes": BUCKET}, 2: {"bucket_bytes": BUCKET}}),
    "specs-disagree": ("llama", lambda: _changed(_trainer_state("llama")), lambda: _trainer_state("llama"),
                       {}, {}),
    "unknown-name": ("llama", lambda: _trainer_state("llama", UNKNOWN), lambda: _trainer_state("llama", UNKNOWN),
                     {}, {}),
    "bucket-zero": ("llama", lambda: _trainer_state("llama"), lambda: _trainer_state("llama"),
                    {"bucket_bytes": 0}, {1: {"bucket_bytes": 0}}),
    "bucket-mismatch": ("llama", lambda: _trainer_state("llama"), lambda: _trainer_state("llama"),
                        {"bucket_bytes": BUCKET}, {}),
    "after-errors": ("llama", dict, dict, {}, {}),  # nothing sent: the errors above wrote nothing
    "qwen2-unknown-lenient": ("qwen2", lambda: _trainer_state("qwen2", UNKNOWN),
                              lambda: _trainer_state("qwen2", UNKNOWN), {}, {1: {"strict": False},
                                                                          2: {"strict": False}}),
}


def _join(group: dist.ProcessGroup) -> dict[str, Any]:
    loader.set_tensor_parallel_group(group)
    return {"joined": True}


def _trainer_case(case: str, out: Path) -> dict[str, Any]:
    family, sent, _, options, _ = CASES[case]
    state = sent()
    result = _outcome(lambda: {"sent": loader.send_weights(state, **options)})
    if case in ("llama", "qwen2-unknown-lenient"):
        reference = reference_logits(build_model(family, seed=1), random_ids(tiny_config(family).vocab_size))
        torch.save(reference, out / f"{case}-rank{TRAINER}.pt")
        result["logits"] = str(out / f"{case}-rank{TRAINER}.pt")
    return result


def main(out: Path, root: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tp_group = dist.new_group([1, 2])  # every process takes part in creating it; the trainer is not in it
    results: dict[str, dict[str, Any]] = {}
    if rank == TRAINER:
        results["trainer-joins-tp-group"] = _outcome(_join, tp_group)
        for case in CASES:
            results[case] = _trainer_case(case, out)
    else:
        loader.set_tensor_parallel_group(tp_group)
        inference = Inference(root, out, rank)
        for case, (family, _, expected, _, options) in CASES.items():
            specs = _specs(expected())
            results[case] = _outcome(inference.receive, case, family, specs, **options.get(rank, {}))
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    exit_rank(0)
