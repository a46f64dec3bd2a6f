"""Checkpoints that ship their own modeling code (``auto_map`` in config.json): run only with consent.

As in transformers and vLLM, the checkpoint's code is used only when the user
passes ``trust_remote_code=True`` (CLI ``--trust-remote-code``). Without it, a
checkpoint whose architecture transformers has is built from transformers'
own class (its files are never imported), and one that only its own code can
build is refused with a one-line :class:`~loader.errors.TrustRemoteCodeError`
saying how to opt in. The decision is taken here, before any file of the
checkpoint is imported; nothing else in loader imports a checkpoint's code
(configs are read as JSON, the registry probes installed plugins only).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from loader.errors import ConfigError, TrustRemoteCodeError, UnsupportedError

__all__ = ["AUTO_CONFIG", "AUTO_MODEL", "RemoteClasses", "remote_classes"]

log = logging.getLogger(__name__)

AUTO_MODEL = "AutoModelForCausalLM"
AUTO_CONFIG = "AutoConfig"


@attrs.frozen
class RemoteClasses:
    """The checkpoint's own causal-LM class and (when it has one) config class."""

    model_class: type
    config_class: type | None


def _auto_map(hf_config: Mapping[str, Any]) -> Mapping[str, Any] | None:
    auto_map = hf_config.get("auto_map")
    if not isinstance(auto_map, Mapping) or not isinstance(auto_map.get(AUTO_MODEL), str):
        return None
    return auto_map


def _import_class(reference: str, source_dir: Path) -> type:
    """Import ``reference`` (``module.Class``) from the checkpoint's folder, as transformers does: this runs it."""
    from transformers.dynamic_module_utils import get_class_from_dynamic_module

    if "--" in reference:  # code kept in another repository: loader only runs the checkpoint's own files
        raise UnsupportedError(f"config.json auto_map names {reference!r}, code from another repository; loader "
                               "runs only modeling files inside the checkpoint's folder")
    try:
        found = get_class_from_dynamic_module(reference, str(source_dir), local_files_only=True)
    except (OSError, ValueError, AttributeError) as exc:
        raise ConfigError(f"config.json auto_map {reference!r}: cannot import it from {source_dir}: {exc}") from exc
    return found


def remote_classes(hf_config: Mapping[str, Any], *, architecture: str, known: bool, trust: bool,
                   source_dir: Path | None) -> RemoteClasses | None:
    """The checkpoint's own classes when it ships them and the user trusts it; ``None`` to use transformers'.

    :param known: transformers has a causal-LM class named ``architecture``.
    :raises TrustRemoteCodeError: the checkpoint needs its own code and ``trust`` is false.
    """
    auto_map = _auto_map(hf_config)
    if auto_map is None:
        return None
    reference = str(auto_map[AUTO_MODEL])
    if not trust:
        if known:
            log.info("config.json auto_map names the checkpoint's own %s; transformers' own %s is used "
                     "(trust_remote_code=True runs the checkpoint's)", reference, architecture)
            return None
        raise TrustRemoteCodeError(
            f"architecture {architecture!r} is built by the checkpoint's own code (config.json auto_map "
            f"{AUTO_MODEL}: {reference}), which loader runs only when asked: pass trust_remote_code=True "
            "(CLI --trust-remote-code) if you trust the checkpoint's source"
        )
    if source_dir is None:
        raise UnsupportedError(f"config.json auto_map names {reference!r}, but the checkpoint has no local folder "
                               "to import it from (a streamed source); copy it to a local folder first")
    config_reference = auto_map.get(AUTO_CONFIG)
    config_class = _import_class(str(config_reference), source_dir) if isinstance(config_reference, str) else None
    return RemoteClasses(_import_class(reference, source_dir), config_class)
