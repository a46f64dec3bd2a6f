"""The core's readers for Hugging Face side files: ``config.json`` (with ModelOpt's ``hf_quant_config.json``) and
the tokenizer.

Registered as plugin ``core.hf_files`` with ``trylast``: formats whose files
carry their own metadata (GGUF) answer first. Local folders are read from
disk; a remote source's files through its :class:`~loader.checkpoint.SourceReader`,
so a remote-source plugin need not re-implement these readers. The readers
themselves (bytes or paths) are public, in :mod:`loader.checkpoint`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._model_folder import side_file
from .checkpoint import (
    Source,
    TokenizerBundle,
    WeightFormat,
    load_hf_tokenizer,
    read_json_object,
    read_source_file,
)
from .hookspecs import hookimpl

__all__ = ["MODELOPT_CONFIG", "loader_load_tokenizer", "loader_read_config"]

MODELOPT_CONFIG = "hf_quant_config.json"
"""NVIDIA ModelOpt's exports describe their quantization here rather than in ``config.json`` (older ones only
here): read as ``quantization_config`` with ``quant_method: "modelopt"``, its nested form as the file has it,
when ``config.json`` has none — as vLLM reads it."""


@hookimpl(trylast=True)
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    config = _read_side_json(source, "config.json")
    if config is None or "quantization_config" in config:
        return config
    modelopt = _read_side_json(source, MODELOPT_CONFIG)
    if modelopt is None:
        return config
    return {**config, "quantization_config": {"quant_method": "modelopt", **modelopt}}


def _read_side_json(source: Source, name: str) -> Mapping[str, Any] | None:
    """The JSON object of side file ``name`` (local folder or remote source), or ``None`` if there is none."""
    folder = source.directory
    if folder is None:
        data = read_source_file(source, name)
        return None if data is None else read_json_object(data, name, source.file_uri(name))
    path = side_file(folder, name)
    return None if path is None else read_json_object(path, name)


@hookimpl(trylast=True)
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    folder = source.directory
    if folder is None:
        if source.reader is None:
            return None
        return load_hf_tokenizer(lambda name: read_source_file(source, name), (source.uri or source.location))
    return load_hf_tokenizer(folder)
