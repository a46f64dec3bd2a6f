"""Mistral's native ``params.json``, translated into a Hugging Face-shaped config.

Folders published in Mistral's own layout hold ``params.json`` and
``consolidated.safetensors`` and no ``config.json``. The translation names
the architecture ``MistralForCausalLM``; the tensors' names
(``layers.0.attention.wq.weight``) and interleaved rotary layout are the
format's business (:mod:`loader_plugin_mistral.native_layout`), not the config's. Features of the native format this
plugin does not implement (mixture of experts, vision encoders, quantized
exports, YaRN) are refused with the field named, never silently ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loader.checkpoint import read_json_object, side_file
from loader.errors import ConfigError, UnsupportedError

__all__ = ["native_params_to_hf", "read_native_config"]
DEFAULT_MAX_POSITIONS = 32768

# params.json key -> config.json key, for keys copied unchanged
_RENAMED = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "hidden_dim": "intermediate_size",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "norm_eps": "rms_norm_eps",
    "vocab_size": "vocab_size",
    "rope_theta": "rope_theta",
    "sliding_window": "sliding_window",
    "tied_embeddings": "tie_word_embeddings",
}
_REQUIRED = ("dim", "n_layers", "hidden_dim", "n_heads", "norm_eps", "vocab_size")
_UNSUPPORTED = {
    "moe": "mixture-of-experts (Mixtral-style) models",
    "vision_encoder": "vision encoders",
    "quantization": "quantized native exports",
    "yarn": "YaRN rotary scaling",
}


def native_params_to_hf(params: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The Hugging Face-style config for ``params`` (read from ``where``, named in errors)."""
    for key, what in _UNSUPPORTED.items():
        if params.get(key) is not None:
            raise UnsupportedError(f"{where}: field {key!r} declares {what}, which loader-plugin-mistral "
                                   "does not support")
    missing = [key for key in _REQUIRED if params.get(key) is None]
    if missing:
        raise ConfigError(f"{where}: required field(s) {', '.join(repr(k) for k in missing)} missing")
    config: dict[str, Any] = {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_act": "silu",
    }
    for native, hf in _RENAMED.items():
        if params.get(native) is not None:
            config[hf] = params[native]
    window = config.get("sliding_window")
    if isinstance(window, list):
        raise UnsupportedError(f"{where}: field 'sliding_window' is a per-layer list, which "
                               "loader-plugin-mistral does not support")
    max_positions = params.get("max_position_embeddings", params.get("max_seq_len"))
    config["max_position_embeddings"] = max_positions if max_positions is not None else DEFAULT_MAX_POSITIONS
    return config


def read_native_config(folder: Path) -> dict[str, Any] | None:
    """The translated config of a native Mistral folder, ``None`` for any other folder.

    A folder is native when it holds ``params.json`` and no ``config.json``
    (Hugging Face repositories of Mistral models often carry both; the
    ``config.json`` then wins and the core reads it).
    """
    params_path = side_file(folder, "params.json")
    if params_path is None or side_file(folder, "config.json") is not None:
        return None
    params = read_json_object(params_path, "params.json")
    return native_params_to_hf(params, str(params_path))
