"""The quantization seam: the config gives each layer its method and maps skip lists onto fused layers."""

from __future__ import annotations

import attrs
import pytest

from loader.errors import FusedLayerSkipError, PluginError
from loader.layers import ColumnParallelLinear, QKVParallelLinear, QuantizationConfig, UnquantizedLinearMethod
from loader.layers.quantization import QuantizeMethodBase

TABLE = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


class _Marked(UnquantizedLinearMethod):
    """Dense, but recognisably chosen by the config."""


@attrs.frozen
class _IgnoreList(QuantizationConfig):
    """A frozen config with a checkpoint-named ignore list, like most quantization plugins have."""

    name = "ignore-list"
    ignored: tuple[str, ...] = ()

    def ignores(self, prefix: str) -> bool:
        return prefix.rpartition(".")[2] in self.ignored

    def get_quant_method(self, layer, prefix):
        return _Marked()


def _qkv(config: QuantizationConfig, prefix: str = "model.layers.0.self_attn.qkv_proj") -> QKVParallelLinear:
    return QKVParallelLinear(8, 2, 4, 2, quant_config=config, prefix=prefix)


def test_the_layer_asks_its_config_for_the_method():
    config = _IgnoreList()
    config.set_packed_modules(TABLE)
    assert isinstance(_qkv(config).quant_method, _Marked)
    assert config.packed_modules == {"qkv_proj": ("q_proj", "k_proj", "v_proj"),
                                     "gate_up_proj": ("gate_proj", "up_proj")}


def test_skipping_every_checkpoint_part_leaves_the_fused_layer_unquantized():
    config = _IgnoreList(ignored=("q_proj", "k_proj", "v_proj"))
    config.set_packed_modules(TABLE)
    layer = _qkv(config)
    assert type(layer.quant_method) is UnquantizedLinearMethod
    assert config.skip("model.layers.0.self_attn.qkv_proj")
    assert not config.skip("model.layers.0.mlp.gate_up_proj")
    assert not config.skip("model.layers.0.self_attn.o_proj")


def test_without_the_models_table_checkpoint_names_cannot_reach_a_fused_layer():
    config = _IgnoreList(ignored=("q_proj", "k_proj", "v_proj"))
    assert config.packed_modules == {}
    assert not config.skip("model.layers.0.self_attn.qkv_proj")


def test_a_config_naming_the_fused_layer_itself_skips_it():
    config = _IgnoreList(ignored=("qkv_proj",))
    config.set_packed_modules(TABLE)
    assert config.skip("qkv_proj")


def test_skipping_some_parts_of_a_fused_layer_is_refused_by_name():
    config = _IgnoreList(ignored=("q_proj",))
    config.set_packed_modules(TABLE)
    with pytest.raises(FusedLayerSkipError, match=(
        r"^ignore-list keeps \['model.layers.0.self_attn.q_proj'\] unquantized but quantizes "
        r"\['model.layers.0.self_attn.k_proj', 'model.layers.0.self_attn.v_proj'\], and "
        r"model.layers.0.self_attn.qkv_proj fuses them into one weight; skip all of its parts or none$"
    )):
        _qkv(config)


def test_the_base_config_quantizes_nothing():
    layer = ColumnParallelLinear(4, 4, quant_config=QuantizationConfig(), prefix="proj")
    assert type(layer.quant_method) is UnquantizedLinearMethod


class _Broken(QuantizationConfig):
    name = "broken"

    def __init__(self, result: object = None, error: Exception | None = None) -> None:
        self.result, self.error = result, error

    def get_quant_method(self, layer, prefix) -> QuantizeMethodBase | None:
        if self.error is not None:
            raise self.error
        return self.result  # type: ignore[return-value]


def test_a_config_failing_in_get_quant_method_is_named_not_blamed_on_the_model():
    with pytest.raises(PluginError, match=r"^quantization 'broken' failed in get_quant_method: "
                                          r"KeyError: 'proj'$"):
        ColumnParallelLinear(4, 4, quant_config=_Broken(error=KeyError("proj")), prefix="proj")


def test_a_config_giving_a_non_linear_method_to_a_linear_is_named():
    with pytest.raises(PluginError, match=r"^quantization 'broken' gave str for the linear layer 'proj'; "
                                          r"a linear layer needs a LinearMethodBase$"):
        ColumnParallelLinear(4, 4, quant_config=_Broken(result="nf4"), prefix="proj")


def test_the_shape_records_are_frozen_and_sum_the_output_parts():
    import torch

    from loader.layers import EmbeddingShape, LinearShape, default_weight_loader

    shape = LinearShape(input_size_per_partition=4, output_partition_sizes=[2, 1, 1], input_size=8, output_size=16,
                        params_dtype=torch.float32, weight_loader=default_weight_loader)
    assert shape.output_partition_sizes == (2, 1, 1), "kept as a tuple: the record cannot change under a method"
    assert shape.output_size_per_partition == 4
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        shape.input_size = 9  # type: ignore[misc]
    embedding = EmbeddingShape(rows_per_partition=64, embedding_dim=8, params_dtype=torch.bfloat16,
                               weight_loader=default_weight_loader)
    assert attrs.evolve(embedding, rows_per_partition=32).rows_per_partition == 32
