"""Which architectures transformers can build as a causal LM, and the class and config for one checkpoint.

Read from transformers' auto mappings (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``,
model type -> class name, and ``CONFIG_MAPPING``), so the answer follows the
installed transformers version. The config's ``architectures`` name must be a
causal-LM class transformers has: a name it does not know is refused rather
than guessed from ``model_type`` (a ``...ForSequenceClassification`` or a
misspelt name would otherwise load as something else); ``model_type`` picks
the config class, or the class's own config type when it is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from loader.errors import ConfigError, UnknownArchitectureError

from .remote_code import remote_classes

__all__ = ["GGUF_ARCHITECTURE_KEY", "HFModelSpec", "causal_lm_class_names", "covered_architectures", "hf_model_spec"]

GGUF_ARCHITECTURE_KEY = "gguf_architecture"
"""Key of the config :mod:`.gguf_config` derives: the file's ``general.architecture`` (tensors come under GGUF
names). Defined here, where every load reads it, so a load from ``config.json`` does not import the GGUF module."""


def causal_lm_class_names() -> dict[str, str]:
    """``model_type -> causal-LM class name`` for every model transformers maps (the first class if several)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names: dict[str, str] = {}
    for model_type, value in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items():
        names[model_type] = value if isinstance(value, str) else value[0]
    return names


def covered_architectures() -> tuple[str, ...]:
    """Every causal-LM class name transformers can build, sorted (what ``loader models`` lists)."""
    return tuple(sorted(set(causal_lm_class_names().values())))


@attrs.frozen
class HFModelSpec:
    """The transformers class that serves a checkpoint and its parsed config."""

    architecture: str
    model_class: type
    config: Any
    gguf_architecture: str | None = None
    """The GGUF file's ``general.architecture`` when the config came from one (tensors come under GGUF names)."""


def _transformers_version() -> str:
    import transformers

    return str(transformers.__version__)


def _parse_config(config_class: Any, hf_config: Mapping[str, Any], what: str) -> Any:
    """``config_class`` from the JSON mapping, special floats (``{"__float__": "Infinity"}``) decoded as
    transformers' own ``from_json_file`` does."""
    decode = getattr(config_class, "_decode_special_floats", None)
    values = decode(dict(hf_config)) if callable(decode) else dict(hf_config)
    try:
        return config_class.from_dict(values)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError(f"config.json cannot be read as {what} config: {exc}") from exc


def hf_model_spec(hf_config: Mapping[str, Any], *, trust_remote_code: bool = False,
                  source_dir: Path | None = None) -> HFModelSpec:
    """The transformers causal-LM class and config for ``hf_config``; one-line errors name what is unknown.

    A checkpoint that ships its own code (``auto_map``) gets its own classes only with
    ``trust_remote_code`` (:mod:`.remote_code`), imported from ``source_dir``.
    """
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    gguf_architecture = hf_config.get(GGUF_ARCHITECTURE_KEY)
    hf_config = {key: value for key, value in hf_config.items() if key != GGUF_ARCHITECTURE_KEY}
    archs = hf_config.get("architectures") or []
    arch = str(archs[0]) if isinstance(archs, list) and archs else "(none listed)"
    model_type = hf_config.get("model_type")
    classes = causal_lm_class_names()
    remote = remote_classes(hf_config, architecture=arch, known=arch in set(classes.values()),
                            trust=trust_remote_code, source_dir=source_dir)
    if remote is not None:
        config_class = remote.config_class or getattr(remote.model_class, "config_class", None)
        own = f"the checkpoint's own {getattr(config_class, '__name__', 'config class')}"
        config = _parse_config(config_class, hf_config, own)
        return HFModelSpec(architecture=arch, model_class=remote.model_class, config=config)
    if arch not in set(classes.values()):
        known_type = classes.get(model_type) if isinstance(model_type, str) else None
        hint = (f" (its model_type {model_type!r} has {known_type}: list that in architectures to load it as one)"
                if known_type else f" (model_type {model_type!r})")
        raise UnknownArchitectureError(
            f"architecture {arch!r} is not registered by any installed plugin, and transformers "
            f"{_transformers_version()} has no causal-LM class of that name{hint}"
        )
    class_name = arch
    model_class = getattr(transformers, class_name, None)
    if not isinstance(model_class, type):
        raise UnknownArchitectureError(f"transformers {_transformers_version()} maps {model_type!r} to "
                                       f"{class_name}, which it does not export")
    if not isinstance(model_type, str):  # a config written without one: the class's own config type
        model_type = getattr(getattr(model_class, "config_class", None), "model_type", None)
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ConfigError(f"config.json model_type {model_type!r}: transformers {_transformers_version()} has no "
                          f"config class for it (needed to build {class_name})")
    config = _parse_config(CONFIG_MAPPING[model_type], hf_config, f"a transformers {model_type}")
    return HFModelSpec(architecture=class_name, model_class=model_class, config=config,
                       gguf_architecture=gguf_architecture if isinstance(gguf_architecture, str) else None)
