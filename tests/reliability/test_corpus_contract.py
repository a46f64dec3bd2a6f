"""Inputs that broke the one-line-error contract (issue 16, items 11-12): refused by name, not blamed on a plugin.

A ``sharded_state.json`` whose ``tp_size`` is not a positive integer; a ``.bin``
whose keys are not strings or whose tensors are quantized, sparse or on the
``meta`` device; rotary settings and a bitsandbytes ``nested_offset`` that are
infinite or NaN (Python's ``json`` reads ``Infinity`` and ``NaN``). Each must be
a :class:`~loader.errors.LoadError` naming the file, tensor or field, never a
bare ``OverflowError``, a :class:`~loader.errors.PluginError` blaming the model
class, or a silent load. :mod:`.test_corpus_cli` runs these through the CLI too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from loader.errors import CheckpointFormatError, ConfigError
from tests.helpers.malformed import TINY_LLAMA, llama_tensors, write_config, write_llama_checkpoint
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params
from tests.reliability.test_corpus_bnb import STATE, _state_field, _tensors_changed

BIN = "pytorch_model.bin"
MARKER = "sharded_state.json"


def _sharded(tp_size_json: str) -> Callable[[Path], Built]:
    """A valid tp=1 sharded-state folder whose marker's ``tp_size`` is replaced by raw JSON text."""

    def build(folder: Path) -> Built:
        from loader._sharded.save import save_sharded

        source = folder / "source"
        write_llama_checkpoint(source, shards=1)
        out = folder / "sharded"
        save_sharded(str(source), out, tp_size=1, dtype="float32")
        marker = json.loads((out / MARKER).read_text())
        marker["tp_size"] = "@TP@"
        (out / MARKER).write_text(json.dumps(marker).replace('"@TP@"', tp_size_json))
        return Built(out, (str(out / MARKER), "'tp_size'", tp_size_json))

    return build


def _bin(change: Callable[[dict[Any, torch.Tensor]], str], *fragments: str) -> Callable[[Path], Built]:
    """The tiny Llama as one ``.bin`` with one entry changed; ``change`` returns the culprit's name."""

    def build(folder: Path) -> Built:
        model = folder / "model"
        write_config(model)
        state: dict[Any, torch.Tensor] = dict(llama_tensors())
        culprit = change(state)
        torch.save(state, model / BIN)
        return Built(model, (str(model / BIN), culprit, *fragments))

    return build


def _int_key(state: dict[Any, torch.Tensor]) -> str:
    state[7] = state.pop("model.norm.weight")
    return "7"


def _quantized(state: dict[Any, torch.Tensor]) -> str:
    name = "model.norm.weight"
    state[name] = torch.quantize_per_tensor(state[name], 0.1, 0, torch.qint8)
    return repr(name)


def _sparse(state: dict[Any, torch.Tensor]) -> str:
    name = "model.layers.0.mlp.down_proj.weight"
    state[name] = state[name].to_sparse()
    return repr(name)


def _meta(state: dict[Any, torch.Tensor]) -> str:
    name = "model.norm.weight"
    state[name] = torch.empty(state[name].shape, device="meta")
    return repr(name)


def _config(changes: dict[str, Any], *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        write_llama_checkpoint(model, shards=1)
        write_config(model, {**TINY_LLAMA, **changes})
        return Built(model, fragments)

    return build


def _bnb_nested_offset(value: float) -> Callable[[Path], Built]:
    return _tensors_changed(_state_field("nested_offset", value), STATE, "'nested_offset'")


_INF, _NAN = float("inf"), float("nan")
_LINEAR = {"rope_type": "linear", "factor": 2.0}

CASES = [
    CorpusCase("sharded-tp-size-infinite", _sharded("Infinity"), CheckpointFormatError),
    CorpusCase("sharded-tp-size-fraction", _sharded("1.9"), CheckpointFormatError),
    CorpusCase("sharded-tp-size-boolean", _sharded("true"), CheckpointFormatError),
    CorpusCase("bin-key-not-a-string", _bin(_int_key, "key", "int"), CheckpointFormatError),
    CorpusCase("bin-quantized-tensor", _bin(_quantized, "quantized"), CheckpointFormatError),
    CorpusCase("bin-sparse-tensor", _bin(_sparse, "sparse"), CheckpointFormatError),
    CorpusCase("bin-meta-tensor", _bin(_meta, "meta"), CheckpointFormatError),
    CorpusCase("rope-theta-infinite", _config({"rope_theta": _INF}, "'rope_theta'", "inf"), ConfigError),
    CorpusCase("rope-theta-nan", _config({"rope_theta": _NAN}, "'rope_theta'", "nan"), ConfigError),
    CorpusCase("rope-parameters-theta-infinite",
               _config({"rope_parameters": {"rope_type": "default", "rope_theta": _INF}},
                       "'rope_parameters.rope_theta'", "inf"), ConfigError),
    CorpusCase("rope-scaling-factor-infinite", _config({"rope_scaling": {**_LINEAR, "factor": _INF}},
                                                       "'rope_scaling.factor'", "inf"), ConfigError),
    CorpusCase("rope-scaling-factor-nan", _config({"rope_scaling": {**_LINEAR, "factor": _NAN}},
                                                  "'rope_scaling.factor'", "nan"), ConfigError),
    CorpusCase("partial-rotary-factor-infinite",
               _config({"rope_scaling": {**_LINEAR, "partial_rotary_factor": _INF}},
                       "'rope_scaling.partial_rotary_factor'", "inf"), ConfigError),
    CorpusCase("bnb-nested-offset-infinite", _bnb_nested_offset(_INF), CheckpointFormatError),
    CorpusCase("bnb-nested-offset-nan", _bnb_nested_offset(_NAN), CheckpointFormatError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_contract_case_is_refused_by_name(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)

