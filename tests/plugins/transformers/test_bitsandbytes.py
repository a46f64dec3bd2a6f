"""bitsandbytes in flight on the fallback's linear layers, through the quantization config's own methods."""

from __future__ import annotations

import copy

import bitsandbytes.functional as F
import pytest
import torch

import loader
from loader_plugin_bnb.linear_method import BitsAndBytesLinearMethod
from tests.helpers.hf_checkpoints import relative_error
from tests.helpers.hf_fallback_checkpoints import reference_logits, save_fallback_checkpoint

IDS = torch.tensor([[1, 17, 42, 99, 3, 200, 7, 64]])


def _quantized_layers(model):
    return {name.removeprefix("hf_model."): module for name, module in model.named_modules()
            if isinstance(getattr(module, "quant_method", None), BitsAndBytesLinearMethod)}


@pytest.mark.parametrize(("model_type", "linears_per_layer", "transposed"),
                         [("olmo2", 7, False), ("gpt2", 4, True)])
def test_linears_quantized_and_logits_follow_the_dequantized_reference(tmp_path, model_type, linears_per_layer,
                                                                        transposed):
    reference = save_fallback_checkpoint(tmp_path, model_type)
    model = loader.load_model(str(tmp_path), dtype="float32", quantization="bitsandbytes",
                              quantization_options={"quant_type": "nf4"})
    layers = _quantized_layers(model)
    assert len(layers) == linears_per_layer * reference.config.num_hidden_layers  # the output head stays dense
    state = reference.state_dict()
    dequantized = copy.deepcopy(reference)
    dense = dict(dequantized.named_parameters())
    for name, layer in layers.items():
        weight = state[f"{name}.weight"]
        weight = weight.t().contiguous() if transposed else weight  # Conv1D stores (in, out)
        expected = F.dequantize_4bit(*F.quantize_4bit(weight, blocksize=64, quant_type="nf4"))
        ours = layer.quant_method.dequantized_weight(layer)
        assert torch.equal(ours, expected), name
        with torch.no_grad():
            dense[f"{name}.weight"].copy_(ours.t() if transposed else ours)
    with torch.no_grad():
        actual = model(IDS)
    assert relative_error(actual, reference_logits(dequantized, IDS)) <= 1e-2
    assert relative_error(actual, reference_logits(reference, IDS)) > 1e-3
