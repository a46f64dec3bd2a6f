"""Refuse a model that cannot fit before allocating it.

The model is built on the ``meta`` device first, so its exact parameter bytes
are known for free. A config with an absurd vocabulary or hidden size (from a
hostile or corrupt checkpoint) is refused here with the figures, instead of
the process dying in the allocator or the kernel's OOM killer.
"""

from __future__ import annotations

import torch

from .._settings import SKIP_MEMORY_CHECK
from ..errors import UnsupportedError

__all__ = ["available_bytes", "check_fits"]


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
    except OSError:
        return None
    try:
        kib = int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])
    except (KeyError, ValueError):
        return None
    return kib * 1024


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device`` (RAM plus free swap for the CPU), or ``None`` if unknown."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        return _meminfo_available()
    return None


def check_fits(needed: int, device: torch.device, what: str) -> None:
    """Raise :class:`UnsupportedError` if ``needed`` bytes exceed what ``device`` has free.

    ``LOADER_SKIP_MEMORY_CHECK=1`` turns the check off (overcommitted hosts, unified memory).
    """
    if SKIP_MEMORY_CHECK.read():
        return
    free = available_bytes(device)
    if free is not None and needed > free:
        raise UnsupportedError(
            f"{what}: the model needs {needed / 1e9:.2f} GB for its parameters on {device}, "
            f"but only {free / 1e9:.2f} GB is available (check the config's sizes)"
        )
