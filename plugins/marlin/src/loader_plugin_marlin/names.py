"""The ``quant_method`` values this plugin loads, in a module of their own so the entry point can test a
config against them without importing :mod:`.config` and :mod:`.detection` (attrs classes: tens of KiB held
by every process that discovers plugins)."""

from __future__ import annotations

__all__ = ["DECLARED_METHODS"]

DECLARED_METHODS = ("gptq", "awq", "compressed-tensors", "fp8", "fbgemm_fp8", "modelopt")
"""The keys of :data:`.detection.METHODS`."""
