"""Tiny model modules written into a test's tmp folder, for the registry's tests.

The registry must never import a model module to answer ``model_info``; to
check that, tests register classes from modules that exist only in their own
tmp folder (put on ``sys.path``, which the probe child inherits), so they are
independent of the real model plugins.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

__all__ = ["TOY_WITH_TORCH", "TOY_WITHOUT_TORCH", "forget_module", "write_module"]

TOY_WITHOUT_TORCH = """
from loader._interfaces import SupportsQuantization, SupportsTensorParallel

class ToyForCausalLM(SupportsTensorParallel, SupportsQuantization):
    is_text_generation_model = True
    tied_embeddings_supported = True
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

class PlainModel:
    pass
"""

TOY_WITH_TORCH = """
import torch
from loader._interfaces import SupportsPipelineParallel

class TorchToyForCausalLM(torch.nn.Module, SupportsPipelineParallel):
    is_text_generation_model = True
"""


def write_module(root: Path, name: str, source: str) -> Path:
    """Write ``root/name.py`` (``name`` may be dotted: packages get an ``__init__.py``)."""
    *packages, leaf = name.split(".")
    folder = root
    for package in packages:
        folder = folder / package
        folder.mkdir(exist_ok=True)
        (folder / "__init__.py").touch()
    path = folder / f"{leaf}.py"
    path.write_text(textwrap.dedent(source))
    importlib.invalidate_caches()
    return path


def forget_module(name: str) -> None:
    """Drop ``name`` and its submodules from ``sys.modules`` (after a test imported them)."""
    for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[loaded]
