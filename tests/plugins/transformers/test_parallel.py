"""How the fallback reads a ``base_model_tp_plan`` and which styles it shards."""

from __future__ import annotations

import pytest
import torch

from loader._distributed import simulated_tp
from loader.errors import UnsupportedError
from loader.layers.linear import ColumnParallelLinear, RowParallelLinear
from loader_plugin_transformers.parallel import SplitInputRowParallelLinear, plan_style, swap_linears
from tests.helpers.hf_fallback_checkpoints import fallback_config

PLAN = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.o_proj": "rowwise"}


def test_plan_patterns_match_whole_names_with_any_layer_index():
    assert plan_style("layers.12.self_attn.q_proj", PLAN) == "colwise"
    assert plan_style("layers.0.self_attn.o_proj", PLAN) == "rowwise"
    assert plan_style("layers.x.self_attn.q_proj", PLAN) is None
    assert plan_style("layers.0.self_attn.q_proj.lora", PLAN) is None


def _meta_model(model_type):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(fallback_config(model_type), dtype=torch.float32)


def test_olmo2_plan_becomes_loader_layers():
    model = _meta_model("olmo2")
    with simulated_tp(1, 2), torch.device("meta"):
        swap_linears(model, architecture="Olmo2ForCausalLM", plan=model.config.base_model_tp_plan,
                     quant_config=None, dtype=torch.float32)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert isinstance(attn.q_proj, ColumnParallelLinear) and attn.q_proj.gather_output
    assert isinstance(attn.o_proj, SplitInputRowParallelLinear)
    assert isinstance(mlp.up_proj, ColumnParallelLinear) and not mlp.up_proj.gather_output
    assert type(mlp.down_proj) is RowParallelLinear
    assert isinstance(model.lm_head, torch.nn.Linear)  # the head stays transformers'


def test_a_style_it_cannot_shard_is_named():
    model = _meta_model("granite")
    with simulated_tp(0, 2), torch.device("meta"), pytest.raises(UnsupportedError) as exc:
        swap_linears(model, architecture="GraniteForCausalLM", plan={"layers.*.mlp.up_proj": "packed_colwise"},
                     quant_config=None, dtype=torch.float32)
    assert str(exc.value) == ("GraniteForCausalLM: base_model_tp_plan gives layers.0.mlp.up_proj the style "
                              "'packed_colwise'; the transformers fallback shards only colwise, rowwise, "
                              "colwise_gather_output, rowwise_split_input")


def test_plain_loads_keep_transformers_modules():
    model = _meta_model("granite")
    assert swap_linears(model, architecture="GraniteForCausalLM", plan=model.config.base_model_tp_plan,
                        quant_config=None, dtype=torch.float32) == set()
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear


@pytest.mark.parametrize("rank", [0, 1])
def test_fewer_kv_heads_than_ranks_are_replicated(rank):
    from transformers import AutoModelForCausalLM

    from loader_plugin_transformers.parallel import ReplicatedHeadsLinear

    config = fallback_config("granite", num_key_value_heads=1)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with simulated_tp(rank, 2), torch.device("meta"):
        swap_linears(model, architecture="GraniteForCausalLM", plan=config.base_model_tp_plan,
                     quant_config=None, dtype=torch.float32)
    attn = model.model.layers[0].self_attn
    head = config.hidden_size // config.num_attention_heads
    assert isinstance(attn.k_proj, ReplicatedHeadsLinear) and isinstance(attn.v_proj, ReplicatedHeadsLinear)
    assert tuple(attn.k_proj.weight.shape) == (head, config.hidden_size)  # the one KV head, on both ranks
    assert attn.k_proj._output_part(None).start == 0 and attn.k_proj._output_part(None).full == head
    assert tuple(attn.q_proj.weight.shape) == (config.hidden_size // 2, config.hidden_size)
    assert attn.num_key_value_groups == config.num_attention_heads // 2  # this rank's query heads share it


def test_a_fused_qkv_with_fewer_kv_heads_than_ranks_is_refused():
    from transformers import AutoModelForCausalLM

    config = fallback_config("phi3", num_key_value_heads=1)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with simulated_tp(0, 2), torch.device("meta"), pytest.raises(UnsupportedError) as exc:
        swap_linears(model, architecture="Phi3ForCausalLM", plan=config.base_model_tp_plan,
                     quant_config=None, dtype=torch.float32)
    assert str(exc.value).startswith("Phi3ForCausalLM: num_key_value_heads=1 is fewer than tensor parallel size 2, "
                                     "and its key/value projections are not separate k_proj/v_proj modules")
