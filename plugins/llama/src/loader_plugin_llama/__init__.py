"""loader plugin: Llama 2/3/3.x model family for loader.

Plugins that build on the Llama decoder (Mistral, Qwen, an out-of-tree
variant) import these names from ``loader_plugin_llama`` itself: the
package's ``__all__`` is its public surface, and its submodules (``config``,
``decoder``, ``model``, ...) are internal, free to change between releases
(``tests/core/test_plugin_api.py`` fails on a plugin that reaches into one).
Names are imported on first use (PEP 562): discovery imports this package to
reach :mod:`.plugin` without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loader.lazy import lazy_exports

if TYPE_CHECKING:
    from .config import MAX_LAYERS, LlamaConfig, parse_llama_config, read_decoder_config
    from .config_fields import ConfigFields
    from .decoder import LlamaAttention, LlamaDecoderLayer, LlamaMLP, LlamaModel
    from .model import LlamaForCausalLM

__all__ = [
    "MAX_LAYERS",
    "ConfigFields",
    "LlamaAttention",
    "LlamaConfig",
    "LlamaDecoderLayer",
    "LlamaForCausalLM",
    "LlamaMLP",
    "LlamaModel",
    "parse_llama_config",
    "read_decoder_config",
]

__getattr__, __dir__ = lazy_exports(__name__, globals(), {
    "MAX_LAYERS": ".config",
    "LlamaConfig": ".config",
    "parse_llama_config": ".config",
    "read_decoder_config": ".config",
    "ConfigFields": ".config_fields",
    "LlamaAttention": ".decoder",
    "LlamaDecoderLayer": ".decoder",
    "LlamaMLP": ".decoder",
    "LlamaModel": ".decoder",
    "LlamaForCausalLM": ".model",
})
