"""What a load leaves on its model so that ``reload_weights`` can fill it again the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from torch import nn

    from ._options import LoadOptions
    from ._plugins import PluginHost
    from .layers.quantization import QuantizationConfig

__all__ = ["LoadRecord", "load_record_of", "remember_load"]

_RECORD = "_loader_load_record"


@attrs.frozen
class LoadRecord:
    """The load a model came from: where, with which options, plugins, rank and quantization.

    :ivar location: the source as the user gave it (a folder, a Hub id, ``s3://...``, a ``.gguf`` file).
    :ivar options: the resolved options (dtype, device, format, quantization, expert parallelism).
    :ivar hf_config: the checkpoint's config, to refuse a new source whose shapes differ before any write.
    """

    location: str
    options: LoadOptions
    host: PluginHost | None
    quant_config: QuantizationConfig | None
    tp_rank: int
    tp_size: int
    hf_config: Mapping[str, Any] = attrs.field(eq=False)


def remember_load(model: nn.Module, record: LoadRecord) -> None:
    """Keep ``record`` on ``model`` (outside its parameters, buffers and submodules)."""
    model.__dict__[_RECORD] = record


def load_record_of(model: nn.Module) -> LoadRecord | None:
    """The record :func:`remember_load` kept, or ``None`` for a model ``loader.load_model`` did not return."""
    record = model.__dict__.get(_RECORD)
    return record if isinstance(record, LoadRecord) else None
