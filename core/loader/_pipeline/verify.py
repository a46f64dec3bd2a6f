"""The pipeline's guards: no tensor twice, no parameter left unfilled."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from torch import nn

from ..errors import CheckpointFormatError, MissingWeightsError
from ..weights import CheckpointTensor

__all__ = ["check_all_filled", "reject_duplicates"]

_SHOWN = 20


def reject_duplicates(stream: Iterable[tuple[str, CheckpointTensor]]) -> Iterator[tuple[str, CheckpointTensor]]:
    """Pass the stream through, failing if a tensor name comes twice (e.g. in two shards).

    Runs after a format's renaming, so a tensor stored under two names that
    rename to one (Mistral's ``layers.0.attention.wq.weight`` beside
    ``model.layers.0.self_attn.q_proj.weight``) is caught; the message then
    gives each stored name.
    """
    seen: dict[str, str] = {}
    for name, tensor in stream:
        where = tensor.file if tensor.name in (name, "<memory>") else f"{tensor.file} (stored as {tensor.name!r})"
        if name in seen:
            raise CheckpointFormatError(f"tensor {name!r} appears twice: in {seen[name]} and in {where}")
        seen[name] = where
        yield name, tensor


def check_all_filled(model: nn.Module, loaded: set[str], source: str) -> None:
    """Raise :class:`MissingWeightsError` naming every parameter ``load_weights`` did not fill."""
    missing = [name for name, _ in model.named_parameters() if name not in loaded]
    if missing:
        shown = ", ".join(missing[:_SHOWN]) + (f", ... ({len(missing)} in all)" if len(missing) > _SHOWN else "")
        raise MissingWeightsError(f"{source}: the checkpoint has no weights for parameter(s) {shown}")
