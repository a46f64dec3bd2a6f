"""loader.update_weights on a GPTQ model: its layers were repacked at load, so new tensors are refused by name.

A GPTQ model updated with checkpoint B's own GPTQ tensors (qweight, qzeros, scales, g_idx), or with float tensors,
is refused before anything is written, naming the tensor, the layer and why; the model is left as loaded.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import loader
from loader.errors import UnsupportedError
from tests.helpers.gptq_checkpoints import save_gptq_checkpoint
from tests.helpers.model_checks import random_ids

REASON = (r"which cannot be updated in place: its quantize method PackedLinearMethod repacked the checkpoint tensors "
          r"\(qweight, qzeros, scales, g_idx\) into the int4pack kernel's buffers at load, which replaced them; "
          r"load the new checkpoint with loader.load_model; nothing was written "
          r"\(the update was checked whole first\)$")


@pytest.fixture(scope="module")
def gptq_a_b(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    root = tmp_path_factory.mktemp("gptq-update")
    a, _ = save_gptq_checkpoint("llama", root / "A", bits=4, group_size=32, sym=True, seed=0)
    b, reference_b = save_gptq_checkpoint("llama", root / "B", bits=4, group_size=32, sym=True, seed=1)
    tensors_b: dict[str, torch.Tensor] = {}
    for file in sorted(b.glob("*.safetensors")):
        tensors_b.update(load_file(str(file)))
    return a, tensors_b, reference_b.state_dict()


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(random_ids(model.config.vocab_size))  # type: ignore[no-any-return]


@pytest.mark.parametrize(("weights", "tensor", "layer"), [
    ("gptq", "model.layers.0.mlp.down_proj.g_idx", "model.layers.0.mlp.down_proj"),
    ("float", "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.qkv_proj"),
])
def test_new_tensors_for_a_repacked_layer_are_refused_by_name(gptq_a_b, weights, tensor, layer) -> None:
    a, tensors_b, float_b = gptq_a_b
    model = loader.load_model(str(a), dtype="float32")
    before = _logits(model)
    state = tensors_b if weights == "gptq" else float_b
    with pytest.raises(UnsupportedError, match=rf"^tensor '{tensor}' of the update is for layer '{layer}', {REASON}"):
        loader.update_weights(model, state)
    assert torch.equal(_logits(model), before)
    assert loader.weights_version(model) == 0


def test_a_reload_is_refused_too(gptq_a_b) -> None:
    a, _, _ = gptq_a_b
    model = loader.load_model(str(a), dtype="float32")
    with pytest.raises(UnsupportedError, match="PackedLinearMethod repacked the checkpoint tensors"):
        loader.reload_weights(model)
    assert loader.weights_version(model) == 0
