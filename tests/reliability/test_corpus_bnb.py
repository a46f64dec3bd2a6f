"""Pre-quantized bitsandbytes checkpoints inconsistent with their quant state: refused naming the tensor.

Each case writes a valid tiny NF4 Llama and breaks one side tensor of one
packed weight (or the config's ``quantization_config``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import loader
from loader.errors import CheckpointFormatError, ShapeMismatchError, UnsupportedError
from tests.helpers.malformed import TINY_LLAMA, write_config, write_safetensors
from tests.helpers.malformed_bnb import (
    BNB_QUANTIZATION_CONFIG,
    QUANT_STATE_SUFFIX,
    quant_state_bytes,
    read_quant_state,
    write_bnb_checkpoint,
)
from tests.reliability.corpus import Built, CorpusCase, assert_load_refused, case_params

WEIGHT = "model.layers.1.mlp.down_proj.weight"
STATE = WEIGHT + QUANT_STATE_SUFFIX


def _tensors_changed(change: Callable[[dict[str, torch.Tensor]], None], *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        tensors = write_bnb_checkpoint(model)
        change(tensors)
        write_safetensors(model / "model.safetensors", tensors)
        return Built(model, (str(model / "model.safetensors"), *fragments))

    return build


def _drop(suffix: str) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        del tensors[WEIGHT + suffix]

    return change


def _state_text(text: str | bytes) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        raw = text if isinstance(text, bytes) else text.encode()
        tensors[STATE] = torch.tensor(list(raw), dtype=torch.uint8)

    return change


def _state_field(key: str, value: object) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        state = read_quant_state(tensors, WEIGHT)
        state[key] = value
        tensors[STATE] = quant_state_bytes(json.dumps(state))

    return change


def _shrink_packed(tensors: dict[str, torch.Tensor]) -> None:
    tensors[WEIGHT] = tensors[WEIGHT][: tensors[WEIGHT].shape[0] // 2].clone()


def _absmax_float16(tensors: dict[str, torch.Tensor]) -> None:
    tensors[WEIGHT + ".absmax"] = tensors[WEIGHT + ".absmax"].to(torch.float16)


def _scrambled_code_table(tensors: dict[str, torch.Tensor]) -> None:
    tensors[WEIGHT + ".quant_map"] = tensors[WEIGHT + ".quant_map"].flip(0).clone()


def _orphan_absmax(tensors: dict[str, torch.Tensor]) -> None:
    tensors["model.layers.0.mlp.extra_proj.weight.absmax"] = torch.zeros(4)


def _quantization(changes: dict[str, object], *fragments: str) -> Callable[[Path], Built]:
    def build(folder: Path) -> Built:
        model = folder / "model"
        write_bnb_checkpoint(model)
        write_config(model, {**TINY_LLAMA, "quantization_config": {**BNB_QUANTIZATION_CONFIG, **changes}})
        return Built(model, fragments)

    return build


CASES = [
    CorpusCase("bnb-missing-absmax", _tensors_changed(_drop(".absmax"), repr(WEIGHT), f"'{WEIGHT}.absmax'"),
               CheckpointFormatError),
    CorpusCase("bnb-missing-nested-absmax", _tensors_changed(_drop(".nested_absmax"), f"'{WEIGHT}.nested_absmax'"),
               CheckpointFormatError),
    CorpusCase("bnb-missing-quant-state", _tensors_changed(_drop(QUANT_STATE_SUFFIX), repr(WEIGHT),
                                                           "quant_state"), CheckpointFormatError),
    CorpusCase("bnb-quant-state-not-json", _tensors_changed(_state_text("{'blocksize': 64"), STATE,
                                                            "quant_state is not valid UTF-8 JSON"),
               CheckpointFormatError),
    CorpusCase("bnb-quant-state-not-utf8", _tensors_changed(_state_text(b'{"quant_type": "\xff"}'), STATE,
                                                            "quant_state"),
               CheckpointFormatError),
    CorpusCase("bnb-quant-state-nested-too-deep", _tensors_changed(_state_text("[" * 20_000), STATE,
                                                                   "quant_state"), CheckpointFormatError),
    CorpusCase("bnb-quant-state-not-an-object", _tensors_changed(_state_text("[64]"), STATE,
                                                                 "must be an object, found list"),
               CheckpointFormatError),
    CorpusCase("bnb-blocksize-invalid", _tensors_changed(_state_field("blocksize", 100), STATE,
                                                         "blocksize 100 is not one of"), CheckpointFormatError),
    CorpusCase("bnb-quant-type-disagrees", _tensors_changed(_state_field("quant_type", "fp4"), STATE,
                                                            "quant_type 'fp4'", "'nf4'"), CheckpointFormatError),
    CorpusCase("bnb-shape-not-2d", _tensors_changed(_state_field("shape", [32, 32, 1]), STATE, "[32, 32, 1]"),
               CheckpointFormatError),
    CorpusCase("bnb-shape-disagrees-with-model", _tensors_changed(_state_field("shape", [64, 32]), repr(WEIGHT),
                                                                  "(64, 32)"), ShapeMismatchError),
    CorpusCase("bnb-wrong-packed-size", _tensors_changed(_shrink_packed, repr(WEIGHT), "packed data",
                                                         "must be 1024 uint8 values"), CheckpointFormatError),
    CorpusCase("bnb-absmax-wrong-dtype", _tensors_changed(_absmax_float16, f"'{WEIGHT}.absmax'", "float16"),
               CheckpointFormatError),
    CorpusCase("bnb-quant-map-not-the-code-table", _tensors_changed(_scrambled_code_table,
                                                                    f"'{WEIGHT}.quant_map'", "code table"),
               CheckpointFormatError),
    CorpusCase("bnb-orphan-side-tensor", _tensors_changed(_orphan_absmax, "'model.layers.0.mlp.extra_proj.weight'"),
               CheckpointFormatError),
    CorpusCase("bnb-config-8bit", _quantization({"load_in_8bit": True, "load_in_4bit": False}, "load_in_8bit"),
               UnsupportedError),
    CorpusCase("bnb-config-quant-type-unknown", _quantization({"bnb_4bit_quant_type": "nf3"}, "'nf3'"),
               UnsupportedError),
]


@pytest.mark.parametrize("case", case_params(CASES))
def test_inconsistent_bnb_checkpoint_is_refused(case: CorpusCase, tmp_path: Path) -> None:
    assert_load_refused(case, tmp_path)


def test_the_undamaged_bnb_base_loads(tmp_path: Path) -> None:
    write_bnb_checkpoint(tmp_path / "model")
    model = loader.load_model(str(tmp_path / "model"), dtype="float32")
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, TINY_LLAMA["vocab_size"])
