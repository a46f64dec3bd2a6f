"""The typed configuration of a Llama-shaped decoder, parsed from ``config.json``.

Llama, Mistral and both Qwen generations share one decoder shape: RMSNorm,
rotary attention with grouped KV heads, a SiLU-gated MLP. They differ only in a
few switches (biases, sliding windows), which
:class:`LlamaConfig` holds explicitly so the model code never consults the raw
mapping. ``transformers`` is not needed: every field is read and checked by
:class:`~loader_plugin_llama.config_fields.ConfigFields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import MoESettings

from .config_fields import ConfigFields
from .rope_settings import RopeSettings, read_rope_settings

__all__ = ["LlamaConfig", "parse_llama_config", "read_decoder_config"]

# Upper bounds well beyond any published model, so a corrupted config fails
# here instead of asking for terabytes in layer construction.
MAX_VOCAB = 1 << 22
MAX_HIDDEN = 1 << 16
MAX_INTERMEDIATE = 1 << 20
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_POSITIONS = 1 << 27

SILU_NAMES = ("silu", "swish")


@attrs.frozen
class LlamaConfig:
    """What the decoder is built from; ``sliding_windows`` has one entry per layer (``None``: full)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeSettings
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_proj_bias: bool = False
    mlp_bias: bool = False
    sliding_windows: tuple[int | None, ...] = ()
    moe: MoESettings | None = None
    """The mixture-of-experts fields (Mixtral, Qwen-MoE); ``None`` for a dense model."""
    dense_layers: frozenset[int] = frozenset()
    """With ``moe``: the layers that keep a dense MLP (Qwen-MoE's ``mlp_only_layers`` and ``decoder_sparse_step``)."""

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Whether layer ``layer_idx`` has a sparse MoE block instead of the dense MLP."""
        return self.moe is not None and layer_idx not in self.dense_layers

    def sliding_window(self, layer_idx: int) -> int | None:
        """The attention window of layer ``layer_idx`` (``None``: attend to every earlier token)."""
        if not self.sliding_windows:
            return None
        return self.sliding_windows[layer_idx]


def read_decoder_config(fields: ConfigFields, **family: Any) -> LlamaConfig:
    """Read the fields every Llama-shaped family shares; ``family`` sets the family's switches.

    Checks the relations between fields too: KV heads dividing query heads, a
    head size that is even (rotary pairs) and, without an explicit
    ``head_dim``, a hidden size the heads divide.
    """
    act = fields.string("hidden_act", "silu")
    if act not in SILU_NAMES:
        raise UnsupportedError(
            f"{fields.what}: config field 'hidden_act' is {act!r}; only 'silu' is supported"
        )
    hidden = fields.integer("hidden_size", maximum=MAX_HIDDEN)
    heads = fields.integer("num_attention_heads", maximum=MAX_HEADS)
    kv_heads = fields.integer("num_key_value_heads", heads, maximum=MAX_HEADS)
    if heads % kv_heads:
        raise ConfigError(
            f"{fields.what}: config field 'num_key_value_heads'={kv_heads} must divide "
            f"'num_attention_heads'={heads}"
        )
    if fields.has("head_dim"):
        head_dim = fields.integer("head_dim", maximum=MAX_HEAD_DIM)
    else:
        if hidden % heads:
            raise ConfigError(
                f"{fields.what}: config field 'hidden_size'={hidden} is not divisible by "
                f"'num_attention_heads'={heads} and no 'head_dim' is given"
            )
        head_dim = hidden // heads
    if head_dim % 2:
        raise ConfigError(f"{fields.what}: the head size {head_dim} must be even for rotary embeddings "
                          "(config fields 'head_dim' or 'hidden_size' / 'num_attention_heads')")
    layers = fields.integer("num_hidden_layers", maximum=MAX_LAYERS)
    values: dict[str, Any] = dict(
        architecture=fields.what,
        vocab_size=fields.integer("vocab_size", maximum=MAX_VOCAB),
        hidden_size=hidden,
        intermediate_size=fields.integer("intermediate_size", maximum=MAX_INTERMEDIATE),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=fields.integer("max_position_embeddings", 2048, maximum=MAX_POSITIONS),
        rms_norm_eps=fields.number("rms_norm_eps", 1e-6, maximum=1.0),
        rope=read_rope_settings(fields),
        tie_word_embeddings=fields.boolean("tie_word_embeddings", False),
    )
    values.update(family)
    windows = values.get("sliding_windows", ())
    if windows and len(windows) != layers:
        raise ConfigError(f"{fields.what}: {len(windows)} per-layer attention kinds given for "
                          f"num_hidden_layers={layers}")
    return LlamaConfig(**values)


def parse_llama_config(hf_config: Mapping[str, Any], architecture: str = "LlamaForCausalLM") -> LlamaConfig:
    """Llama 2/3/3.x: ``attention_bias`` (q/k/v and o), ``mlp_bias``, optional ``head_dim``."""
    fields = ConfigFields(hf_config, architecture)
    attention_bias = fields.boolean("attention_bias", False)
    return read_decoder_config(
        fields,
        qkv_bias=attention_bias,
        o_proj_bias=attention_bias,
        mlp_bias=fields.boolean("mlp_bias", False),
    )
