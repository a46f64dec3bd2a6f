"""loader-plugin-bnb is installed with its hooks, imports light, and decides which loads are its own."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from loader import _hooks as hooks
from loader._options import LoadOptions
from loader._plugins import create_plugin_host
from loader.errors import ConfigError, FusedLayerSkipError, UnsupportedError
from loader_plugin_bnb.config import BitsAndBytesConfig

BNB_CHECKPOINT = {
    "architectures": ["LlamaForCausalLM"],
    "quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
        "bnb_4bit_quant_type": "fp4", "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8",
        "llm_int8_skip_modules": None,
    },
}


def _options(**quantization_options) -> LoadOptions:
    return LoadOptions(dtype=torch.float32, device=torch.device("cpu"), quantization_options=quantization_options)


def _detect(hf_config, requested, **quantization_options):
    return hooks.detect_quantization(hf_config, requested, _options(**quantization_options), create_plugin_host())


def test_plugin_is_loaded_with_its_hooks():
    record = create_plugin_host().records["bnb"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-bnb"
    assert record.hooks == ("loader_detect_quantization",)


def test_entry_point_module_imports_neither_torch_nor_bitsandbytes():
    code = "import sys, loader_plugin_bnb.plugin; print('torch' in sys.modules, 'bitsandbytes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False"


def test_requested_bitsandbytes_quantizes_in_flight_with_the_options():
    config = _detect({"architectures": ["X"]}, "bitsandbytes", quant_type="fp4", blocksize=128,
                     double_quant=True, compute_dtype="bf16", skip_modules=["down_proj"])
    assert isinstance(config, BitsAndBytesConfig)
    assert (config.quant_type, config.blocksize, config.double_quant) == ("fp4", 128, True)
    assert config.compute_dtype == "bfloat16" and config.torch_compute_dtype == torch.bfloat16
    assert config.skip_modules == ("down_proj",)
    assert not config.prequantized
    assert config.describe()["method"] == "bitsandbytes"


def test_in_flight_defaults_are_nf4_blocks_of_64_and_lm_head_skipped():
    config = _detect({}, "bitsandbytes")
    assert (config.quant_type, config.blocksize, config.double_quant, config.compute_dtype) == ("nf4", 64, False, None)
    assert config.skip("lm_head")
    assert not config.skip("model.layers.0.mlp.down_proj")


def test_a_declared_bitsandbytes_checkpoint_loads_prequantized_with_or_without_the_request():
    for requested in (None, "bitsandbytes"):
        config = _detect(BNB_CHECKPOINT, requested)
        assert config.prequantized
        assert (config.quant_type, config.double_quant, config.compute_dtype) == ("fp4", True, "bfloat16")


def test_only_compute_dtype_may_be_overridden_on_a_prequantized_checkpoint():
    assert _detect(BNB_CHECKPOINT, None, compute_dtype="float32").compute_dtype == "float32"
    with pytest.raises(ConfigError, match=r"quantization_options \['blocksize'\] cannot change a checkpoint"):
        _detect(BNB_CHECKPOINT, None, blocksize=128)


def test_dense_checkpoints_and_other_methods_are_not_ours():
    assert _detect({"architectures": ["X"]}, None) is None
    with pytest.raises(UnsupportedError, match="'hqq' is not provided by any installed plugin"):
        _detect({}, "hqq")


def test_asking_to_quantize_an_already_quantized_checkpoint_is_refused():
    declared = {"quantization_config": {"quant_method": "gptq", "bits": 4}}
    with pytest.raises(UnsupportedError, match="quant_method='gptq'; a checkpoint that is already quantized"):
        _detect(declared, "bitsandbytes")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"quant_typ": "nf4"}, ConfigError, r"unknown bitsandbytes option\(s\) \['quant_typ'\]"),
        ({"quant_type": "int4"}, UnsupportedError, "quant type 'int4' is not supported; use 'nf4' or 'fp4'"),
        ({"blocksize": 100}, UnsupportedError, "blocksize 100 is not one of"),
        ({"double_quant": "yes"}, ConfigError, "double_quant must be true or false, found 'yes'"),
        ({"compute_dtype": "int8"}, UnsupportedError, "compute dtype 'int8' is not one of"),
        ({"skip_modules": "lm_head"}, ConfigError, "skip modules must be a list of module names"),
    ],
)
def test_bad_in_flight_options_name_the_option(options, error, message):
    with pytest.raises(error, match=message):
        _detect({}, "bitsandbytes", **options)


def test_eight_bit_and_odd_storage_checkpoints_are_refused():
    eight = {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}}
    with pytest.raises(UnsupportedError, match=r"load_in_8bit \(LLM.int8\) checkpoints are not supported"):
        _detect(eight, None)
    storage = {"quantization_config": {**BNB_CHECKPOINT["quantization_config"], "bnb_4bit_quant_storage": "bfloat16"}}
    with pytest.raises(UnsupportedError, match="bnb_4bit_quant_storage 'bfloat16' is not supported"):
        _detect(storage, None)


def _with_llama_table(config: BitsAndBytesConfig) -> BitsAndBytesConfig:
    """The config as the pipeline hands it to a Llama model: with the model's fused-module table."""
    from loader_plugin_llama.model import LlamaForCausalLM

    config.set_packed_modules(LlamaForCausalLM.packed_modules_mapping)
    return config


def test_skipping_all_parts_of_a_fused_layer_skips_it_and_some_parts_is_refused():
    config = _with_llama_table(BitsAndBytesConfig(skip_modules=("q_proj", "k_proj", "v_proj", "mlp.up_proj")))
    assert config.skip("model.layers.3.self_attn.qkv_proj")
    assert not config.skip("model.layers.3.self_attn.o_proj")
    assert not config.skip("model.layers.3.self_attn.q_proj_extra")
    with pytest.raises(FusedLayerSkipError, match=r"^bitsandbytes keeps \['model.layers.3.mlp.up_proj'\] "
                       r"unquantized but quantizes \['model.layers.3.mlp.gate_proj'\], and "
                       r"model.layers.3.mlp.gate_up_proj fuses them into one weight; skip all of its parts or none$"):
        config.skip("model.layers.3.mlp.gate_up_proj")


def test_linear_layers_get_the_bitsandbytes_method_and_others_do_not():
    from loader.layers.linear import RowParallelLinear
    from loader_plugin_bnb.linear_method import BitsAndBytesLinearMethod

    layer = RowParallelLinear(64, 32, quant_config=BitsAndBytesConfig(), prefix="model.layers.0.mlp.down_proj")
    assert isinstance(layer.quant_method, BitsAndBytesLinearMethod)
    assert layer.weight.dtype == torch.uint8 and tuple(layer.weight.shape) == (64 * 32 // 2, 1)
    assert tuple(layer.weight_absmax.shape) == (32,)
    assert BitsAndBytesConfig().get_quant_method(torch.nn.Linear(2, 2), "x") is None
    skipped = RowParallelLinear(64, 32, quant_config=BitsAndBytesConfig(), prefix="lm_head")
    assert not isinstance(skipped.quant_method, BitsAndBytesLinearMethod)


def test_the_entry_point_s_cheap_test_uses_the_method_name_detection_uses():
    from loader_plugin_bnb import config, names

    assert config.METHOD_NAME is names.METHOD_NAME == "bitsandbytes"
