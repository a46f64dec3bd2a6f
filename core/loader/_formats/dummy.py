"""``load_format="dummy"``: every parameter filled with small random values, no checkpoint read.

Registered as core plugin ``core.dummy``. Detection lists the files of the
format the source really holds (when it holds one), so plugins that read the
configuration from weight files (GGUF) still answer; iteration yields one
tensor per parameter of the built model, under the parameter's own name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .. import _hooks
from ..checkpoint import Source, WeightFormat
from ..errors import SourceNotFoundError
from ..hookspecs import hookimpl
from ..weights import EagerTensor

if TYPE_CHECKING:
    from torch import nn

    from ..weights import CheckpointTensor

__all__ = ["DUMMY", "dummy_weights", "loader_detect_format", "loader_iter_weights"]

DUMMY = "dummy"


@hookimpl
def loader_detect_format(source: Source, requested: str) -> WeightFormat | None:
    if requested != DUMMY:
        return None

    try:
        files = _hooks.detect_format(source, "auto").files
    except SourceNotFoundError:
        files = ()
    return WeightFormat(name=DUMMY, files=files, parameter_names=True)


def dummy_weights(model: nn.Module) -> Iterator[tuple[str, CheckpointTensor]]:
    """Uniform values in ``[-1e-3, 1e-3)`` from one seeded generator, in parameter order (integers: zero)."""
    import torch

    generator = torch.Generator(device="cpu").manual_seed(0)
    for name, param in model.named_parameters():
        values = torch.empty(param.shape, dtype=torch.float32).uniform_(-1e-3, 1e-3, generator=generator)
        values = values.to(param.dtype) if param.is_floating_point() else values.to(torch.int64).to(param.dtype)
        yield name, EagerTensor(values, name, "<dummy>")


@hookimpl
def loader_iter_weights(weight_format: WeightFormat, model: nn.Module | None
                        ) -> Iterator[tuple[str, CheckpointTensor]] | None:
    if weight_format.name != DUMMY or model is None:
        return None
    return dummy_weights(model)
