"""A transformers config for a GGUF file whose architecture no native plugin loads.

The GGUF plugin builds configs only for the architectures loader's own model
classes serve, and refuses any other with an
:class:`~loader.errors.UnknownArchitectureError`. The fallback's hook wrapper
(:mod:`.plugin`) catches that refusal and, when transformers can read the
architecture from GGUF, answers with the config transformers itself would
derive: its own tables (``GGUF_CONFIG_MAPPING``, ``GGUF_CONFIG_DEFAULTS_MAPPING``)
applied to the file's metadata, plus the facts it reads from the tensor list
(tied embeddings, StableLM's bias and residual layout). The tensors are then
read by loader's GGUF reader and renamed by :mod:`.gguf_names`; transformers'
own GGUF loading is never called.

Architectures whose tensors transformers rewrites while loading (its
``TENSOR_PROCESSORS``) are accepted only where :mod:`.gguf_names` performs the
same rewrite; the rest are refused by name rather than loaded wrong.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loader.errors import UnknownArchitectureError, UnsupportedError

from .coverage import GGUF_ARCHITECTURE_KEY

__all__ = ["GGUF_ARCHITECTURE_KEY", "REWRITTEN", "config_from_gguf", "readable_architectures"]

REWRITTEN = ("gemma2", "gemma3", "gpt2")
"""Architectures whose transformers tensor processor :mod:`.gguf_names` reproduces (the others need none)."""

_TIED_ALWAYS = ("falcon", "bloom")  # transformers ties these whatever the file holds
_NATIVE_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
"""Tables transformers has for the native families' GGUF files: the GGUF plugin names those tensors itself."""
_RENAMED_FROM_FILES = ("qwen2_moe", "qwen3_moe", "minimax_m2", "gpt_oss")
"""Table keys transformers reaches by renaming a file's architecture (``qwen2moe``, ...), all with tensor processors."""
_TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "gemma4": "gemma4_text"}  # transformers loads their text backbone


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def readable_architectures() -> tuple[str, ...]:
    """GGUF architectures transformers can read and the fallback can load (sorted)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, TENSOR_PROCESSORS
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return tuple(sorted(
        arch for arch in GGUF_SUPPORTED_ARCHITECTURES
        if arch not in ("general", "tokenizer", *_NATIVE_FAMILIES, *_RENAMED_FROM_FILES)
        and (arch not in TENSOR_PROCESSORS or arch in REWRITTEN)
        and _TEXT_MODEL_TYPES.get(arch, arch) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    ))


def _fields(path: Path) -> tuple[dict[str, Any], list[str]]:
    """Every metadata value (parsed as transformers parses it) and the tensor names, with gguf-py's reader."""
    from gguf import GGUFReader
    from transformers.integrations.ggml import _gguf_parse_value

    reader = GGUFReader(str(path))
    values: dict[str, Any] = {}
    for key, field in reader.fields.items():
        parsed = [_gguf_parse_value(field.parts[i], field.types) for i in field.data]
        values[key] = parsed[0] if len(parsed) == 1 else parsed
    return values, [tensor.name for tensor in reader.tensors]


def config_from_gguf(path: Path, refusal: UnknownArchitectureError, *,
                     other_parts: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The config transformers derives from the GGUF file at ``path``, shaped like ``config.json``.

    ``other_parts``: the rest of a split set, whose tensor names count too (``gguf-split`` keeps the
    metadata in the first part but an untied ``output.weight`` usually in the last).

    ``refusal`` is the GGUF plugin's error; it is raised again, completed with
    what transformers lacks, when transformers cannot read the architecture either.
    """
    from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    values, tensor_names = _fields(path)
    for part in other_parts:
        tensor_names = [*tensor_names, *_fields(part)[1]]
    arch = values.get("general.architecture")
    if isinstance(arch, str) and arch in TENSOR_PROCESSORS and arch not in REWRITTEN:
        raise UnsupportedError(
            f"{path}: GGUF architecture {arch!r} has no native plugin, and transformers rewrites its tensors "
            f"while loading ({TENSOR_PROCESSORS[arch].__name__}), which the transformers fallback does not "
            f"reproduce; it loads GGUF files of: {', '.join(readable_architectures())}"
        )
    if not isinstance(arch, str) or arch not in readable_architectures():
        raise UnknownArchitectureError(f"{refusal}; nor can the transformers fallback read it through transformers "
                                       f"{_transformers_version()}'s GGUF tables (it reads: "
                                       f"{', '.join(readable_architectures())})") from refusal
    config: dict[str, Any] = {}
    if arch == "stablelm":  # as transformers does: read from which tensors exist
        config["use_qkv_bias"] = any(name.endswith(("attn_q.bias", "attn_k.bias", "attn_v.bias"))
                                     for name in tensor_names)
        config["use_parallel_residual"] = not any("ffn_norm" in name for name in tensor_names)
    config["tie_word_embeddings"] = "output.weight" not in tensor_names or arch in _TIED_ALWAYS
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(arch, {}).items():
        config.setdefault(key, value)
    for key, value in values.items():
        prefix, _, rest = key.partition(".")
        section: Any = GGUF_CONFIG_MAPPING.get(prefix, {})
        renamed = section.get(rest, -1)
        if isinstance(renamed, str):  # None: read but unused; -1: not a config key
            config[renamed] = value
    if "vocab_size" not in config and isinstance(values.get("tokenizer.ggml.tokens"), list):
        config["vocab_size"] = len(values["tokenizer.ggml.tokens"])
    model_type = config.get("model_type")
    model_type = _TEXT_MODEL_TYPES.get(model_type, model_type) if isinstance(model_type, str) else None
    config["model_type"] = model_type
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type) if isinstance(model_type, str) else None
    if class_name is None:
        raise UnknownArchitectureError(f"{path}: GGUF architecture {arch!r} maps to transformers model type "
                                       f"{model_type!r}, which has no causal-LM class")
    config["architectures"] = [class_name if isinstance(class_name, str) else class_name[0]]
    config[GGUF_ARCHITECTURE_KEY] = arch
    return config
