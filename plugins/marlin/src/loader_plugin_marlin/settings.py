"""The marlin plugin's environment variables, declared through :mod:`loader.settings` (read with ``.read()``).

Light on purpose (no torch): the docs generator imports it for the user guide's table.
"""

from __future__ import annotations

from loader.settings import FLAG, Setting, integer

__all__ = ["CACHE_MAX_BYTES", "PACKED_CACHE", "SETTINGS"]

PACKED_CACHE = Setting(
    "LOADER_MARLIN_PACKED_CACHE", FLAG, default=True,
    doc="`0`: a GPTQ, AWQ or compressed-tensors load on the CPU neither reads nor writes packed-weights bundles "
        "(by default the first load of a checkpoint writes the kernels' tensors it packed, later loads map "
        "them; see [marlin](marlin.md#the-packed-weights-bundle))")
CACHE_MAX_BYTES = Setting(
    "LOADER_MARLIN_CACHE_MAX_BYTES", integer(0, unit="bytes"), default=8 << 30, default_doc="8 GiB",
    doc="what the marlin plugin's packed-weights bundles may take on disk together before the least recently "
        "used are removed")

SETTINGS = (PACKED_CACHE, CACHE_MAX_BYTES)
"""In the order the user guide lists them, after the core's."""
