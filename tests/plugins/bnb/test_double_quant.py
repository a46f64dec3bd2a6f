"""In-flight double quantization nests each checkpoint module's block scales, as ``transformers`` does.

bitsandbytes' double quantization stores a weight's per-block ``absmax`` as
8-bit codes around the mean of that weight's own ``absmax`` vector, in blocks
of 256. ``transformers`` quantizes ``q_proj``, ``k_proj``, ... one module at a
time, so each has its own nested statistics; nesting over a rank's fused
``qkv_proj`` slice instead gives other numbers, different again at every TP size.
"""

from __future__ import annotations

import pytest
import torch

import loader
from loader._distributed import simulated_tp
from loader_plugin_bnb.linear_method import BitsAndBytesLinearMethod
from tests.helpers.bnb_checkpoints import dequantized_linear_weights
from tests.helpers.hf_checkpoints import save_checkpoint, tiny_config

FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
# hidden 128: every tp=2 slice of every weight is whole 64-value blocks
ALIGNED = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
PER_RANK_PARTS = {"qkv_proj": [64, 32, 32], "gate_up_proj": [128, 128]}  # rows of each part on one of 2 ranks


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    path = tmp_path_factory.mktemp("dq") / "dense"
    save_checkpoint("llama", path, config=tiny_config("llama", **ALIGNED), seed=3)
    return path


def _ours(path, quant_type, rank=0, size=1):
    options = {"quant_type": quant_type, "double_quant": True}
    with simulated_tp(rank, size):
        model = loader.load_model(str(path), dtype="float32", quantization="bitsandbytes",
                                  quantization_options=options)
    return {name: m.quant_method.dequantized_weight(m) for name, m in model.named_modules()
            if isinstance(getattr(m, "quant_method", None), BitsAndBytesLinearMethod)}


def _transformers_in_flight(path, quant_type):
    import transformers

    quant = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quant_type,
                                            bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.float32)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, quantization_config=quant,
                                                              dtype=torch.float32, device_map="cpu")
    return dequantized_linear_weights(model)  # before any forward repacks them


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_in_flight_double_quant_is_transformers_in_flight_bit_for_bit(dense, quant_type):
    expected = _transformers_in_flight(dense, quant_type)
    ours = _ours(dense, quant_type)
    assert len(ours) == 8
    for name, weight in ours.items():
        parent, _, leaf = name.rpartition(".")
        reference = torch.cat([expected[f"{parent}.{part}.weight"] for part in FUSED.get(leaf, (leaf,))])
        assert torch.equal(weight, reference), f"{name}: max difference {(weight - reference).abs().max():.3g}"


def test_in_flight_double_quant_does_not_depend_on_the_tp_size(dense):
    single = _ours(dense, "nf4")
    ranks = [_ours(dense, "nf4", rank, 2) for rank in range(2)]
    for name, weight in single.items():
        leaf = name.rpartition(".")[2]
        if leaf in PER_RANK_PARTS:  # column parallel: each rank holds its rows of every part
            pieces = [r[name].split(PER_RANK_PARTS[leaf]) for r in ranks]
            stitched = torch.cat([p[i] for i in range(len(PER_RANK_PARTS[leaf])) for p in pieces])
        else:  # row parallel: input columns split
            stitched = torch.cat([r[name] for r in ranks], dim=1)
        difference = float((stitched - weight).abs().max())
        assert difference <= 1e-5, f"{name}: tp=2 differs from tp=1 by {difference:.3g}"
