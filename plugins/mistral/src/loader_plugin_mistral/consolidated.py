"""Which files are Mistral's native ``consolidated*.safetensors``: a name test the entry point runs on every
load, in a module of its own so it does not import :mod:`.native_layout` (its renaming step and attrs class)
for checkpoints that are not native."""

from __future__ import annotations

__all__ = ["NATIVE_CONFIG", "is_consolidated"]

NATIVE_CONFIG = "params.json"
"""The config file of a native folder (which has no ``config.json``)."""


def is_consolidated(file: str) -> bool:
    """``consolidated.safetensors`` or a shard of it (``consolidated-00001-of-00002.safetensors``)."""
    base = file.replace("\\", "/").rsplit("/", 1)[-1]
    return base.startswith("consolidated") and base.endswith(".safetensors")
