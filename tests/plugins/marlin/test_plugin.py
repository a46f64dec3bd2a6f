"""loader-plugin-marlin is installed with its hook, imports light, and reads GPTQ configs strictly."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from loader import _hooks as hooks
from loader.checkpoint import LoadOptions
from loader.errors import ConfigError, UnsupportedError
from loader.testing import create_plugin_host
from loader_plugin_marlin.config import GPTQConfig
from loader_plugin_marlin.detection import detect_packed
from tests.helpers.gptq_checkpoints import gptq_quantization_config


def _detect(hf_config, requested=None, **quantization_options):
    options = LoadOptions(dtype=torch.float32, device=torch.device("cpu"), quantization_options=quantization_options)
    return hooks.detect_quantization(hf_config, requested, options, create_plugin_host())


def _declared(**fields):
    return {"quantization_config": {**gptq_quantization_config(4, 128, sym=True, desc_act=False), **fields}}


def test_plugin_is_loaded_with_its_hooks():
    record = create_plugin_host().records["marlin"]
    assert record.status == "loaded", record.error
    assert record.distribution == "loader-plugin-marlin"
    assert record.hooks == ("loader_detect_quantization", "loader_process_weights_after_loading")


def test_entry_point_module_does_not_import_torch():
    code = "import sys, loader_plugin_marlin.plugin; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_gptq_checkpoint_is_detected_with_its_fields():
    for requested in (None, "gptq"):
        config = _detect(_declared(bits=8, group_size=-1, desc_act=True, sym=False,
                                   checkpoint_format="gptq_v2"), requested)
        assert isinstance(config, GPTQConfig)
        assert (config.bits, config.group_size, config.act_order, config.sym) == (8, -1, True, False)
        assert not config.zeros_stored_minus_one and config.pack_factor == 4
    assert _detect(_declared(checkpoint_format=None)).zeros_stored_minus_one  # missing format: v1
    described = _detect(_declared(), kernel="dequantize").describe()
    assert described["method"] == "gptq" and described["kernel"] == "dequantize"


def test_dense_checkpoints_and_other_methods_are_not_ours():
    assert _detect({"architectures": ["X"]}) is None
    assert detect_packed(_declared(), "bitsandbytes", None) is None  # another method was asked for
    with pytest.raises(UnsupportedError, match="quantization='gptq' loads checkpoints already quantized that way, "
                       "but config.json has no quantization_config"):
        _detect({}, "gptq")


@pytest.mark.parametrize(
    ("fields", "error", "message"),
    [
        ({"bits": 3}, UnsupportedError, "bits 3 is not supported; GPTQ checkpoints load with bits 4 or 8"),
        ({"bits": 2}, UnsupportedError, "bits 2 is not supported"),
        ({"group_size": 48}, UnsupportedError, "group_size 48 is not one of"),
        ({"checkpoint_format": "marlin"}, UnsupportedError, "checkpoint_format 'marlin' is not supported"),
        ({"desc_act": "yes"}, ConfigError, "desc_act must be true or false, found 'yes'"),
        ({"lm_head": "yes"}, ConfigError, "lm_head must be true or false, found 'yes'"),
        ({"dynamic": ["lm_head"]}, ConfigError, r"dynamic must map module patterns to settings, found \['lm_head'\]"),
        ({"dynamic": {"lm_head": {"bits": 3}}}, UnsupportedError,
         r"quantization_config.dynamic\['lm_head'\]: bits 3 is not supported"),
        ({"dynamic": {"lm_head": {"sym": "no"}}}, ConfigError, r"dynamic\['lm_head'\]: sym must be true or false"),
        ({"dynamic": {"-:(": {}}}, ConfigError, r"dynamic\['-:\(']: '\(' is not a regular expression"),
        ({"modules_to_not_convert": "lm_head"}, ConfigError, "modules_to_not_convert must be a list"),
    ],
)
def test_bad_config_fields_are_named(fields, error, message):
    with pytest.raises(error, match=message):
        _detect(_declared(**fields))


def test_bad_options_are_named():
    with pytest.raises(ConfigError, match=r"unknown gptq option\(s\) \['kernal'\]"):
        _detect(_declared(), kernal="int4pack")
    with pytest.raises(ConfigError, match="kernel 'exllama' is not one of"):
        _detect(_declared(), kernel="exllama")


def test_linear_layers_get_the_gptq_method_with_checkpoint_shaped_parameters():
    from loader.layers import QKVParallelLinear, RowParallelLinear
    from loader_plugin_marlin.linear_method import PackedLinearMethod

    config = GPTQConfig(bits=4, group_size=32)
    layer = RowParallelLinear(96, 64, quant_config=config, prefix="model.layers.0.mlp.down_proj")
    assert isinstance(layer.quant_method, PackedLinearMethod)
    shapes = {name: (tuple(p.shape), p.dtype) for name, p in layer.named_parameters()}
    assert layer.packed_state.geometry.groups == 3
    assert shapes == {"qweight": ((12, 64), torch.int32), "qzeros": ((3, 8), torch.int32),
                      "scales": ((3, 64), torch.float32), "g_idx": ((96,), torch.int32)}
    qkv = QKVParallelLinear(64, 16, 4, 2, quant_config=config, prefix="model.layers.0.self_attn.qkv_proj")
    assert tuple(qkv.qweight.shape) == (8, 128) and tuple(qkv.qzeros.shape) == (2, 16)
    assert config.get_quant_method(torch.nn.Linear(2, 2), "x") is None
    skipping = GPTQConfig(skip_modules=("down_proj",))
    dense = RowParallelLinear(96, 64, quant_config=skipping, prefix="model.layers.0.mlp.down_proj")
    assert not isinstance(dense.quant_method, PackedLinearMethod)


def test_the_entry_point_s_cheap_test_knows_every_method_detection_loads():
    """The entry point answers ``None`` before importing detection unless ``quant_method`` is one of these."""
    from loader_plugin_marlin.detection import METHODS
    from loader_plugin_marlin.names import DECLARED_METHODS

    assert sorted(DECLARED_METHODS) == sorted(METHODS)
