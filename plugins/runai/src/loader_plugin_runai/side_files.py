"""``config.json`` and the tokenizer of an ``s3://`` checkpoint, fetched with the small-object client.

The core's tokenizer reader takes a folder, so the tokenizer files present
are fetched into a temporary folder and read from there (a few megabytes;
the weights are never downloaded).
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loader.checkpoint import TokenizerBundle

from .s3_folder import S3Folder

__all__ = ["TOKENIZER_FILES", "read_remote_config", "read_remote_tokenizer"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def read_remote_config(folder: S3Folder) -> Mapping[str, Any] | None:
    """The folder's ``config.json``, or ``None`` when it has none (the core then reports the missing config)."""
    if not folder.has("config.json"):
        return None
    return folder.read_json_object("config.json", "config.json")


def read_remote_tokenizer(folder: S3Folder) -> TokenizerBundle | None:
    """The tokenizer built from the folder's tokenizer files, or ``None`` without ``tokenizer.json``."""
    from loader.hf_files import load_hf_tokenizer

    if not folder.has("tokenizer.json"):
        return None
    with tempfile.TemporaryDirectory(prefix="loader-runai-tokenizer-") as tmp:
        for name in TOKENIZER_FILES:
            if folder.has(name):
                (Path(tmp) / name).write_bytes(folder.read_bytes(name))
        return load_hf_tokenizer(Path(tmp))
