"""The core's readers for Hugging Face side files: ``config.json`` and the tokenizer.

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

__all__ = ["loader_load_tokenizer", "loader_read_config"]


@hookimpl(trylast=True)
def loader_read_config(source: Source, weight_format: WeightFormat) -> Mapping[str, Any] | None:
    folder = source.directory
    if folder is None:
        data = read_source_file(source, "config.json")
        return None if data is None else read_json_object(data, "config.json", source.file_uri("config.json"))
    path = side_file(folder, "config.json")
    if path is None:
        return None
    return read_json_object(path, "config.json")



@hookimpl(trylast=True)
def loader_load_tokenizer(source: Source, weight_format: WeightFormat) -> TokenizerBundle | None:
    folder = source.directory
    if folder is None:
        if source.reader is None:
            return None
        return load_hf_tokenizer(lambda name: read_source_file(source, name), (source.uri or source.location))
    return load_hf_tokenizer(folder)
