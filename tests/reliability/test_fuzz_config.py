"""Fuzzing the model config parsers: any ``config.json`` parses within bounds or raises a LoadError.

Each example starts from a valid config of one family and overwrites, adds or
deletes a few fields with hostile JSON (wrong types, extreme integers,
non-finite floats, nested junk). Two harnesses: the family parsers alone
(Llama, Mistral, Mistral's native ``params.json``, Qwen2, Qwen3), and the model
classes built on the ``meta`` device from the same configs, which runs every
layer constructor (rotary scaling, sliding windows, head arithmetic) without
allocating. A config accepted by a parser must honour the bounds the model
code relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

from loader._context import ModelContext
from loader.errors import LoadError
from loader_plugin_llama.config import (
    MAX_HEAD_DIM,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_INTERMEDIATE,
    MAX_LAYERS,
    MAX_VOCAB,
    LlamaConfig,
    parse_llama_config,
)
from loader_plugin_llama.model import LlamaForCausalLM
from loader_plugin_mistral.model import MistralForCausalLM, parse_mistral_config
from loader_plugin_mistral.native_config import native_params_to_hf
from loader_plugin_qwen.config import parse_qwen2_config, parse_qwen3_config
from loader_plugin_qwen.model import Qwen2ForCausalLM, Qwen3ForCausalLM
from tests.helpers.malformed import TINY_LLAMA
from tests.reliability.conftest import FUZZ_PROFILE
from tests.reliability.fuzz_values import EXTREME_INTS, json_values

FUZZ = settings(parent=settings.get_profile(FUZZ_PROFILE))

ROPE_SCALINGS = [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "linear", "factor": 2.0}, {"type": "dynamic", "factor": 2.0}, None,
]
NATIVE_PARAMS = {"dim": 32, "n_layers": 2, "hidden_dim": 64, "n_heads": 4, "n_kv_heads": 2, "norm_eps": 1e-5,
                 "vocab_size": 64, "rope_theta": 10000.0}

FAMILIES: dict[str, tuple[dict[str, Any], Callable[[Mapping[str, Any]], LlamaConfig]]] = {
    "llama": ({**TINY_LLAMA, "rope_scaling": ROPE_SCALINGS[0]}, parse_llama_config),
    "mistral": ({**TINY_LLAMA, "architectures": ["MistralForCausalLM"], "sliding_window": 16},
                parse_mistral_config),
    "mistral-native": (NATIVE_PARAMS,
                       lambda params: parse_mistral_config(native_params_to_hf(params, "params.json"))),
    "qwen2": ({**TINY_LLAMA, "architectures": ["Qwen2ForCausalLM"], "use_sliding_window": True,
               "sliding_window": 16, "max_window_layers": 1}, parse_qwen2_config),
    "qwen3": ({**TINY_LLAMA, "architectures": ["Qwen3ForCausalLM"], "head_dim": 16,
               "layer_types": ["sliding_attention", "full_attention"], "use_sliding_window": True,
               "sliding_window": 8}, parse_qwen3_config),
}
MODEL_CLASSES = {"llama": LlamaForCausalLM, "mistral": MistralForCausalLM, "mistral-native": MistralForCausalLM,
                 "qwen2": Qwen2ForCausalLM, "qwen3": Qwen3ForCausalLM}

FIELDS = sorted({key for base, _ in FAMILIES.values() for key in base} | {
    "head_dim", "attention_bias", "mlp_bias", "rope_parameters", "rope_scaling", "layer_types",
    "moe", "quantization", "max_seq_len", "tied_embeddings"})


def hostile_values(small: bool) -> st.SearchStrategy[Any]:
    """What a field may be replaced with; ``small`` keeps integers small enough to build quickly."""
    ints = st.integers(-2, 70) if small else (st.integers(-5, 5000) | EXTREME_INTS)
    return st.one_of(ints, json_values(4), st.sampled_from(ROPE_SCALINGS),
                     st.lists(st.sampled_from(["full_attention", "sliding_attention", "other"]), max_size=3))


@st.composite
def mutated_configs(draw: st.DrawFn, small: bool = False) -> tuple[str, dict[str, Any]]:
    family = draw(st.sampled_from(sorted(FAMILIES)))
    config = dict(FAMILIES[family][0])
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(FIELDS) | st.text(max_size=8))
        if draw(st.integers(0, 5)) == 0:
            config.pop(key, None)
        else:
            config[key] = draw(hostile_values(small))
    return family, config


def check_bounds(parsed: LlamaConfig) -> None:
    """What layer construction relies on once a parser has accepted a config."""
    assert 1 <= parsed.vocab_size <= MAX_VOCAB and 1 <= parsed.hidden_size <= MAX_HIDDEN
    assert 1 <= parsed.intermediate_size <= MAX_INTERMEDIATE and 1 <= parsed.num_hidden_layers <= MAX_LAYERS
    assert 1 <= parsed.num_key_value_heads <= parsed.num_attention_heads <= MAX_HEADS
    assert parsed.num_attention_heads % parsed.num_key_value_heads == 0
    assert 2 <= parsed.head_dim <= MAX_HEAD_DIM and parsed.head_dim % 2 == 0
    assert parsed.rms_norm_eps > 0 and parsed.rope.theta > 0
    assert len(parsed.sliding_windows) in (0, parsed.num_hidden_layers)


@FUZZ
@given(mutated_configs())
def test_config_parsers_accept_within_bounds_or_raise_load_error(case: tuple[str, dict[str, Any]]) -> None:
    family, config = case
    try:
        parsed = FAMILIES[family][1](config)
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("accepted")
    check_bounds(parsed)


@FUZZ
@given(mutated_configs(small=True))
def test_models_build_on_meta_or_raise_load_error(case: tuple[str, dict[str, Any]]) -> None:
    family, config = case
    try:
        hf_config = native_params_to_hf(config, "params.json") if family == "mistral-native" else config
        with torch.device("meta"):
            model = MODEL_CLASSES[family](ModelContext(hf_config=hf_config, dtype=torch.bfloat16))
    except LoadError as exc:
        event(f"refused: {type(exc).__name__}")
        return
    event("built")
    assert all(p.device.type == "meta" for p in model.parameters())
