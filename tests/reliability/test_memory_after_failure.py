"""A failed load gives its memory back: ~1.1 GB of bf16 parameters filled, then the load fails.

The checkpoint is a Llama of about 570M parameters written as sparse files
(holes read back as zeros, so nothing is written to disk). Its weights are
really read into freshly allocated parameters before the failure: a last shard
cut short, or a tensor missing (found only after every other tensor is in).
Afterwards the process's resident memory must be back within 10% of the
model's size of where it was, with the exception still held by the caller, and
the model object must be gone.
"""

from __future__ import annotations

import gc
import json
import os
import weakref
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import loader
from loader.errors import CheckpointFormatError, LoadError, MissingWeightsError
from tests.helpers.malformed import INDEX_NAME, TINY_LLAMA, llama_shapes, write_config, write_sparse_safetensors

BIG_LLAMA: dict[str, Any] = {
    **TINY_LLAMA, "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 10,
    "num_attention_heads": 16, "num_key_value_heads": 4, "torch_dtype": "bfloat16",
}
SHARDS = 4
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * PAGE


def _write_big_checkpoint(folder: Path, *, drop: str | None = None) -> tuple[int, Path]:
    """Sparse bf16 shards of :data:`BIG_LLAMA`; returns the parameter bytes and the last shard."""
    write_config(folder, BIG_LLAMA)
    shapes = llama_shapes(BIG_LLAMA)
    names = [n for n in shapes if n != drop]
    per = -(-len(names) // SHARDS)
    weight_map: dict[str, str] = {}
    last = folder
    for k in range(SHARDS):
        file = f"model-{k + 1:05d}-of-{SHARDS:05d}.safetensors"
        part = names[k * per:(k + 1) * per]
        last = write_sparse_safetensors(folder / file, {n: ("BF16", shapes[n], 2) for n in part})
        weight_map.update(dict.fromkeys(part, file))
    (folder / INDEX_NAME).write_text(json.dumps({"weight_map": weight_map}))
    total = 0
    for shape in shapes.values():
        n = 2
        for s in shape:
            n *= s
        total += n
    return total, last


def _cut_last_shard(last: Path) -> None:
    with last.open("r+b") as fh:
        fh.truncate(last.stat().st_size - 4096)


@pytest.fixture
def watched(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Record a weakref to the model once materialized, and the highest RSS seen at the load's checkpoints."""
    from loader._pipeline import load as load_module
    from loader_plugin_safetensors import stream as stream_module

    seen: dict[str, Any] = {"model": None, "peak": 0}
    real_materialize, real_open = load_module.materialize, stream_module.open_checkpoint_file
    real_check = load_module.check_all_filled

    def materialize(model: nn.Module, device: Any) -> None:
        real_materialize(model, device)
        seen["model"] = weakref.ref(model)

    def open_checkpoint_file(path: Any, stats: Any = None) -> Any:
        seen["peak"] = max(seen["peak"], rss_bytes())
        return real_open(path, stats)

    def check_all_filled(*args: Any) -> None:
        seen["peak"] = max(seen["peak"], rss_bytes())
        real_check(*args)

    monkeypatch.setattr(load_module, "materialize", materialize)
    monkeypatch.setattr(load_module, "check_all_filled", check_all_filled)
    monkeypatch.setattr(stream_module, "open_checkpoint_file", open_checkpoint_file)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["copied", "mapped"])
@pytest.mark.parametrize(("damage", "error"), [("last-shard-cut", CheckpointFormatError),
                                               ("tensor-missing", MissingWeightsError)])
def test_failed_load_returns_memory_and_drops_the_model(tmp_path: Path, watched: dict[str, Any], damage: str,
                                                        error: type[LoadError], storage: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # copied: every byte lands in fresh memory; mapped: parameters are the file's pages, populated only
    # once every weight is in place (so a load cut short by a truncated shard never populated them)
    monkeypatch.setenv("LOADER_MAP_WEIGHTS", "0" if storage == "copied" else "1")
    drop = "model.layers.9.mlp.down_proj.weight" if damage == "tensor-missing" else None
    size, last = _write_big_checkpoint(tmp_path / "big", drop=drop)
    if damage == "last-shard-cut":
        _cut_last_shard(last)
    gc.collect()
    before = rss_bytes()

    with pytest.raises(error) as info:
        loader.load_model(str(tmp_path / "big"), dtype="bfloat16")
    after_raise = rss_bytes()
    gc.collect()
    after_gc = rss_bytes()

    grew, kept = (watched["peak"] - before) / 1e6, (after_gc - before) / 1e6
    print(f"\n{damage}: model {size / 1e9:.2f} GB; RSS before {before / 1e6:.0f} MB, peak +{grew:.0f} MB, "
          f"after raise +{(after_raise - before) / 1e6:.0f} MB, after gc +{kept:.0f} MB")
    assert info.value is not None, "the caller still holds the exception and its traceback"
    if storage == "copied" or damage == "tensor-missing":
        assert watched["peak"] - before > 0.6 * size, "the parameters were really allocated and filled"
    assert after_raise - before < 0.1 * size, f"{(after_raise - before) / 1e6:.0f} MB still held after the raise"
    assert after_gc - before < 0.1 * size
    assert watched["model"] is not None and watched["model"]() is None, "the half-loaded model is still alive"
