"""``reload_weights``: a loaded model filled again from a checkpoint, without being built again.

The same steps as a load, minus building and materializing: the source is
prepared (any folder, Hub id, ``s3://`` prefix, GGUF file, sharded state a
format plugin reads), its tensors streamed through the format's iterator, the
quantization's ``wrap_weights`` and the model's ``load_weights`` into the
parameters' existing storage, and the quantized layers post-processed again.
Formats that name parameters (sharded state, already post-processed) are
copied by name. The new source must be of the same architecture and shapes:
its config is compared with the loaded one before the first write, every
tensor's shape is checked as it lands, and every parameter must be filled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs
import torch
from torch import nn

from .. import _hooks
from .._load_record import LoadRecord, load_record_of
from .._mapped_parameters import writes_in_place
from .._pipeline.by_name import load_by_name
from .._pipeline.prepare import PreparedCheckpoint, SourceLocation, prepare_checkpoint, source_location
from .._pipeline.verify import reject_duplicates
from .._session import LoadSession, load_session
from ..errors import ConfigError, MissingWeightsError, UnsupportedError
from ..weights import CheckpointTensor, ReadStats
from .driving import CountingStream
from .tracking import check_storage_kept, reprocess, storage_addresses, tracked_writes
from .update import UpdateReport, apply_stream, bump_version, exclusive_update, weights_version

__all__ = ["SHAPE_FIELDS", "reload_weights"]

SHAPE_FIELDS = ("architectures", "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "num_experts",
                "num_local_experts", "tie_word_embeddings")
"""Config fields that decide the model's parameters: a new source must agree on each one both configs have."""


def _check_same_model(loaded: Mapping[str, Any], prepared: PreparedCheckpoint) -> None:
    """Refuse a source whose config differs in a field that shapes the parameters, before any write."""
    for field in SHAPE_FIELDS:
        if field in loaded and field in prepared.hf_config and loaded[field] != prepared.hf_config[field]:
            raise ConfigError(
                f"{prepared.source.display()}: {field} is {prepared.hf_config[field]!r} where the loaded model "
                f"has {loaded[field]!r}; reload_weights fills the same model again, so load this source with "
                "loader.load_model instead")


def _stream(record: LoadRecord, prepared: PreparedCheckpoint, model: nn.Module
            ) -> Iterator[tuple[str, CheckpointTensor]]:
    """The new source's tensors as a load streams them: the format's iterator, renaming, duplicates refused,
    the quantization's wrapping."""
    weight_format = prepared.weight_format
    options = attrs.evolve(record.options, weight_format=weight_format.name, weight_files=weight_format.files)
    stream = _hooks.iter_weights(prepared.source, weight_format, options, ReadStats(), record.host, model)
    if weight_format.renaming is not None:
        stream = weight_format.renaming(stream, prepared.hf_config)
    stream = reject_duplicates(stream)
    if record.quant_config is not None and not weight_format.parameter_names:
        stream = record.quant_config.wrap_weights(stream)
    return stream


def _check_every_parameter(model: nn.Module, filled: set[int], source: str, written: int) -> None:
    missing = [name for name, param in model.named_parameters() if id(param) not in filled]
    if missing:
        shown = ", ".join(missing[:20]) + (f", ... ({len(missing)} in all)" if len(missing) > 20 else "")
        raise MissingWeightsError(
            f"{source}: the checkpoint has no weights for parameter(s) {shown}; the reload wrote {written} "
            f"tensor(s), and the weights version stays {weights_version(model)}")


def _fill(model: nn.Module, record: LoadRecord, prepared: PreparedCheckpoint) -> tuple[int, int, tuple[str, ...]]:
    """Write the new source into ``model``; return (tensors, bytes, layers post-processed again)."""
    stream = _stream(record, prepared, model)
    display = prepared.source.display()
    with tracked_writes(model) as tracker, torch.no_grad(), writes_in_place():
        if prepared.weight_format.parameter_names:  # already in the parameters' final layout: copied by name
            counting = CountingStream(stream)
            names = load_by_name(model, counting)
            counting.finish_current()
            params = dict(model.named_parameters())
            _check_every_parameter(model, {id(params[n]) for n in names if n in params}, display, counting.finished)
            return counting.finished, counting.bytes, ()
        counting = apply_stream(model, stream, tracker, strict=True, skipped={}, complete=True)
        _check_every_parameter(model, set(tracker.touched), display, counting.finished)
        return counting.finished, counting.bytes, reprocess(tracker)


def reload_weights(model: nn.Module, source: SourceLocation | None = None) -> UpdateReport:
    """Fill a loaded ``model`` again from ``source`` (default: where it was loaded from), in place.

    :param model: a model returned by :func:`loader.load_model`, on this rank.
    :param source: a checkpoint of the same architecture and shapes, anything :func:`loader.load_model` takes,
        read with the same options (format, dtype, quantization).
    :returns: what was written; the model's weights version is one more.
    :raises loader.LoadError: a source of another model (refused before any write), a tensor that does not
        land, or a parameter the source has no weights for; the version is then unchanged.
    """
    record = load_record_of(model)
    if record is None:
        raise UnsupportedError(f"reload_weights needs a model returned by loader.load_model; this "
                               f"{type(model).__name__} does not say where it was loaded from")
    start = time.perf_counter()
    location = record.location if source is None else source_location(source)
    session = LoadSession(host=record.host, tp_rank=record.tp_rank, tp_size=record.tp_size,
                          dtype=record.options.dtype, device=record.options.device,
                          enable_expert_parallel=record.options.enable_expert_parallel)
    with exclusive_update(model), load_session(session):
        prepared = prepare_checkpoint(location, record.options, record.host)
        _check_same_model(record.hf_config, prepared)
        before = storage_addresses(model)
        tensors, nbytes, reprocessed = _fill(model, record, prepared)
        check_storage_kept(model, before)
        version = bump_version(model)
    names = tuple(sorted(name for name, _ in model.named_parameters()))
    return UpdateReport(version=version, tensors=tensors, parameters=names, skipped=(), reprocessed=reprocessed,
                        bytes=nbytes, seconds=time.perf_counter() - start)
