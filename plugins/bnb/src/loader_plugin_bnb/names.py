"""The method's name, in a module of its own so the entry point can test a config against it without
importing :mod:`.config` (its attrs classes are tens of KiB held by every process that discovers plugins)."""

from __future__ import annotations

__all__ = ["METHOD_NAME"]

METHOD_NAME = "bitsandbytes"
