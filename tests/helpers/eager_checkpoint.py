"""A checkpoint folder's tensors as ``(name, EagerTensor)`` pairs, without the pipeline.

Model-plugin tests use it to call ``load_weights`` directly on a model built
in-process (for instance inside ``loader._distributed.simulated_tp``), so they
test the name mapping and sharding without depending on a format plugin.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import load_file

from loader._context import ModelContext
from loader.checkpoint import read_json_object
from loader.weights import EagerTensor


def eager_weights(folder: Path) -> Iterator[tuple[str, EagerTensor]]:
    """Every tensor of every ``*.safetensors`` file in ``folder``, in file then name order."""
    for file in sorted(folder.glob("*.safetensors")):
        for name, tensor in sorted(load_file(str(file)).items()):
            yield name, EagerTensor(tensor, name=name, file=str(file))


def build_model(
    cls: type, folder: Path, dtype: torch.dtype = torch.float32, **overrides: object
) -> torch.nn.Module:
    """``cls`` built on the CPU from ``folder/config.json`` (with ``overrides``), weights not loaded."""
    config = {**read_json_object(folder / "config.json", "config.json"), **overrides}
    return cls(ModelContext(hf_config=config, dtype=dtype))

