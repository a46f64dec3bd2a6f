"""The pipeline hands Llama's fused-module table to the quantization config before building the layers."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

import loader
from loader._plugins import create_plugin_host
from loader.errors import FusedLayerSkipError, PluginError
from loader.layers import QuantizationConfig, UnquantizedLinearMethod
from loader.layers.linear import LinearBase
from loader_plugin_llama.model import LlamaForCausalLM
from tests.helpers.malformed import TINY_LLAMA, write_llama_checkpoint


class _Marked(UnquantizedLinearMethod):
    """Dense, but recognisably chosen by the config."""


@attrs.frozen
class _SkipList(QuantizationConfig):
    """Skips modules by their checkpoint names, as bitsandbytes' ``llm_int8_skip_modules`` does."""

    name = "skip-list"
    skipped: tuple[str, ...] = ()

    def ignores(self, prefix: str) -> bool:
        return prefix.rpartition(".")[2] in self.skipped

    def get_quant_method(self, layer, prefix):
        return _Marked()


class _SkipListPlugin:
    def __init__(self, skipped: tuple[str, ...]) -> None:
        self.skipped = skipped

    @loader.hookimpl
    def loader_detect_quantization(self, requested):
        return _SkipList(self.skipped) if requested == "skip-list" else None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("seam") / "model"
    write_llama_checkpoint(folder)
    return folder


def _load(checkpoint: Path, skipped: tuple[str, ...]):
    host = create_plugin_host()
    host.register(_SkipListPlugin(skipped), "skip-list")
    return loader.load_model(str(checkpoint), dtype="float32", quantization="skip-list", host=host)


def _methods(model) -> dict[str, str]:
    return {name.rpartition(".")[2]: type(m.quant_method).__name__
            for name, m in model.named_modules() if isinstance(m, LinearBase)}


def test_skipping_q_k_and_v_by_checkpoint_name_leaves_qkv_proj_unquantized(checkpoint):
    model = _load(checkpoint, ("q_proj", "k_proj", "v_proj"))
    assert _methods(model) == {"qkv_proj": "UnquantizedLinearMethod", "o_proj": "_Marked",
                               "gate_up_proj": "_Marked", "down_proj": "_Marked"}


def test_skipping_gate_and_up_leaves_gate_up_proj_unquantized(checkpoint):
    assert _methods(_load(checkpoint, ("gate_proj", "up_proj")))["gate_up_proj"] == "UnquantizedLinearMethod"


def test_skipping_only_q_proj_fails_naming_the_fused_layer(checkpoint):
    with pytest.raises(FusedLayerSkipError, match=r"^skip-list keeps \['model.layers.0.self_attn.q_proj'\] "
                                                  r"unquantized but quantizes .*model.layers.0.self_attn.qkv_proj "
                                                  r"fuses them into one weight"):
        _load(checkpoint, ("q_proj",))


class BadTable(LlamaForCausalLM):
    """A model whose fused-module table is not a mapping."""

    packed_modules_mapping = ("qkv_proj",)  # type: ignore[assignment]


class _BadTableModels:
    @loader.hookimpl
    def loader_register_architectures(self, register):
        register("BadTableForCausalLM", "tests.plugins.llama.test_quantization_seam:BadTable")


def test_a_malformed_fused_table_is_named_when_a_quantization_needs_it(tmp_path):
    write_llama_checkpoint(tmp_path / "model", config={**TINY_LLAMA, "architectures": ["BadTableForCausalLM"]})
    host = create_plugin_host()
    host.register(_BadTableModels(), "bad-table")
    host.register(_SkipListPlugin(()), "skip-list")
    with pytest.raises(PluginError, match=r"^model class for BadTableForCausalLM: BadTable.packed_modules_mapping: "
                                          r"expected a dict of module name -> list of names, found tuple$"):
        loader.load_model(str(tmp_path / "model"), dtype="float32", quantization="skip-list", host=host)


class _BrokenPlan(UnquantizedLinearMethod):
    def layer_plan(self, layer):
        raise RuntimeError("no plan")


@attrs.frozen
class _BrokenPlanConfig(QuantizationConfig):
    name = "broken-plan"

    def get_quant_method(self, layer, prefix):
        return _BrokenPlan()


class _BrokenPlanPlugin:
    @loader.hookimpl
    def loader_detect_quantization(self, requested):
        return _BrokenPlanConfig() if requested == "broken-plan" else None


def test_the_layer_plan_of_the_skip_list_and_a_failing_plan_is_named(checkpoint):
    """``loader inspect --layers``: skipped layers plan as dense, and a method's own bug names the quantization."""
    from loader._pipeline.plan import plan_layers

    host = create_plugin_host()
    host.register(_SkipListPlugin(("q_proj", "k_proj", "v_proj")), "skip-list")
    host.register(_BrokenPlanPlugin(), "broken-plan")
    plan = plan_layers(str(checkpoint), quantization="skip-list", host=host)
    assert plan["quantization"] == {"method": "skip-list"}
    assert plan["layers"]["model.layers.0.self_attn.qkv_proj"] == {"kernel": "dense", "reason": None}
    with pytest.raises(PluginError, match=r"^quantization 'broken-plan' failed in layer_plan for "
                                          r"model.layers.0.self_attn.qkv_proj: RuntimeError: no plan$"):
        plan_layers(str(checkpoint), quantization="broken-plan", host=host)
