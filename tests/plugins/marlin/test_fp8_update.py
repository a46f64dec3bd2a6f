"""loader.update_weights on an FP8 model: B's FP8 tensors are dequantized into the layers' existing buffers.

The layers were dequantized into kernel buffers at load; an update reopens the layers it names, lands B's
``weight`` / scales / ``input_scale`` through the same loaders as a load and copies the rebuilt kernel into the
same buffers. A layer given only some of its tensors, or some parts of a fused one, is refused by name before
anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

import loader
from loader._pipeline.load import load_model_with_report
from loader.errors import UnsupportedError
from tests.helpers.fp8_checkpoints import save_fp8_checkpoint
from tests.helpers.model_checks import random_ids


def _load(path: Path, **options: Any) -> Any:
    return load_model_with_report(str(path), dtype="float32", quantization_options=options or None)[0]


def _logits(model: Any) -> torch.Tensor:
    with torch.no_grad():
        return model(random_ids(model.config.vocab_size))  # type: ignore[no-any-return]


def _storage(model: torch.nn.Module) -> dict[str, int]:
    return {name: t.data_ptr() for name, t in [*model.named_parameters(), *model.named_buffers()]}


@pytest.mark.parametrize(("layout", "options"), [("fp8-block", {}), ("fbgemm", {}), ("ct-tensor-static", {}),
                                                 ("ct-channel-token", {"kernel": "scaled_mm"})])
def test_an_update_with_b_fp8_tensors_equals_a_fresh_load_of_b(tmp_path, layout, options) -> None:
    a, _ = save_fp8_checkpoint("qwen2", tmp_path / "A", layout, seed=0)
    b, _ = save_fp8_checkpoint("qwen2", tmp_path / "B", layout, seed=1)
    model = _load(a, **options)
    storage = _storage(model)
    before = _logits(model)
    report = loader.update_weights(model, load_file(b / "model.safetensors"))
    after = _logits(model)
    assert not torch.equal(after, before)
    assert torch.equal(after, _logits(_load(b, **options)))
    assert _storage(model) == storage
    assert "model.layers.0.self_attn.qkv_proj" in report.reprocessed
    assert not any(name.endswith(("weight_scale", "input_scale")) for name, _ in model.named_parameters())


@pytest.mark.parametrize(("given", "message"), [
    (("model.layers.1.mlp.down_proj.weight",),
     r"layer 'model.layers.1.mlp.down_proj' \(Fp8LinearMethod\) was given weight \(whole\) but not all of "
     r"weight_scale_inv: an FP8 layer is rebuilt from its whole tensor set \(weight, weight_scale_inv, every part "
     r"of a fused layer\); give all of them or none"),
    (tuple(f"model.layers.0.self_attn.{part}_proj.{name}" for part in "qk" for name in ("weight", "weight_scale_inv")),
     r"layer 'model.layers.0.self_attn.qkv_proj' \(Fp8LinearMethod\) was given weight \(parts k, q\), "
     r"weight_scale_inv \(parts k, q\) but not all of weight, weight_scale_inv"),
])
def test_a_layer_given_part_of_its_set_is_refused_before_any_write(tmp_path, given, message) -> None:
    a, _ = save_fp8_checkpoint("llama", tmp_path / "A", "fp8-block", seed=0)
    b, _ = save_fp8_checkpoint("llama", tmp_path / "B", "fp8-block", seed=1)
    model = _load(a)
    before = _logits(model)
    tensors = load_file(b / "model.safetensors")
    with pytest.raises(UnsupportedError, match=f"^{message}"):
        loader.update_weights(model, {name: tensors[name] for name in given})
    assert torch.equal(_logits(model), before)
    loader.update_weights(model, tensors)  # the layers reopen cleanly
    assert torch.equal(_logits(model), _logits(_load(b)))
