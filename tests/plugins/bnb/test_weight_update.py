"""loader.update_weights on an NF4 in-flight model: float weights quantized in place, as a fresh load of them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import loader
from loader.errors import UnsupportedError
from tests.helpers.hf_checkpoints import build_model, save_checkpoint
from tests.helpers.model_checks import random_ids


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("bnb-update")
    save_checkpoint("llama", root / "A", seed=0)
    save_checkpoint("llama", root / "B", seed=1)
    return root / "A", root / "B"


def _nf4(path: Path, **options: object) -> torch.nn.Module:
    return loader.load_model(str(path), dtype="float32", quantization="bitsandbytes",
                             quantization_options={"quant_type": "nf4", **options})


def test_an_nf4_update_with_float_weights_equals_a_fresh_nf4_load(pair) -> None:
    a, b = pair
    model = _nf4(a)
    pointers = {name: p.data_ptr() for name, p in model.named_parameters()}
    report = loader.update_weights(model, build_model("llama", seed=1).state_dict())
    fresh = _nf4(b)
    for (name, updated), (_, expected) in zip(model.named_parameters(), fresh.named_parameters(), strict=True):
        assert torch.equal(updated, expected), name
    for (name, updated), (_, expected) in zip(model.named_buffers(), fresh.named_buffers(), strict=True):
        assert torch.equal(updated, expected), name
    ids = random_ids(256)
    with torch.no_grad():
        assert torch.equal(model(ids), fresh(ids))
    assert {name: p.data_ptr() for name, p in model.named_parameters()} == pointers
    assert "model.layers.0.self_attn.qkv_proj" in report.reprocessed


def test_a_double_quantized_layer_is_refused_by_name(pair) -> None:
    a, _ = pair
    model = _nf4(a, double_quant=True)
    with pytest.raises(UnsupportedError, match=r"parameter 'model.layers.0.self_attn.qkv_proj.weight' of layer "
                                               r"'model.layers.0.self_attn.qkv_proj' cannot be updated in place: its "
                                               r"bitsandbytes block scales are double-quantized \(double_quant\).*"
                                               r"nothing was written"):
        loader.update_weights(model, {"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)})
    assert loader.weights_version(model) == 0
