"""Gather a pre-quantized checkpoint's side tensors into one tensor per weight.

A ``transformers`` bitsandbytes checkpoint names, for every quantized weight
``X.weight``, up to five siblings (``X.weight.absmax``, ``X.weight.quant_map``,
``X.weight.nested_absmax``, ``X.weight.nested_quant_map``,
``X.weight.quant_state.bitsandbytes__nf4``). Model plugins know nothing of
them: this stream filter holds the (unread) handles of a weight until its
set is complete, then yields the single name ``X.weight`` with a
:class:`~loader_plugin_bnb.packed_tensor.Packed4bitTensor`, which the model
routes like any dense weight (``q_proj`` into ``qkv_proj``, shard ``"q"``).
Only the tiny JSON header is read here; tensors that are not part of a
packed weight pass through untouched and in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from loader.errors import CheckpointFormatError
from loader.weights import CheckpointTensor

from .packed_tensor import Packed4bitTensor, QuantTensors
from .quant_state import QUANT_STATE_PREFIX, QuantStateHeader, parse_quant_state

__all__ = ["SIDE_SUFFIXES", "group_packed_weights"]

SIDE_SUFFIXES = ("nested_quant_map", "nested_absmax", "quant_map", "absmax")
"""Tensor-valued parts of a quant state, longest first so ``nested_absmax`` is not read as ``absmax``."""


def _split_side_name(name: str) -> tuple[str, str] | None:
    """``("X.weight", role)`` when ``name`` is a side tensor of ``X.weight``, else ``None``."""
    if "." + QUANT_STATE_PREFIX in name:
        base, _, _ = name.partition("." + QUANT_STATE_PREFIX)
        return base, "quant_state"
    for suffix in SIDE_SUFFIXES:
        if name.endswith("." + suffix):
            return name[: -len(suffix) - 1], suffix
    return None


class _Pending:
    """The pieces of one packed weight seen so far."""

    def __init__(self) -> None:
        self.tensors: dict[str, CheckpointTensor] = {}
        self.header: QuantStateHeader | None = None
        self.first_seen: CheckpointTensor | None = None

    def needed(self) -> list[str]:
        roles = ["weight", "absmax", "quant_map", "quant_state"]
        if self.header is not None and self.header.nested:
            roles += ["nested_absmax", "nested_quant_map"]
        return [r for r in roles if r not in self.tensors]

    def build(self) -> Packed4bitTensor:
        assert self.header is not None
        t = self.tensors
        return Packed4bitTensor(QuantTensors(
            t["weight"], t["absmax"], t["quant_map"], self.header,
            t.get("nested_absmax"), t.get("nested_quant_map"),
        ))


def group_packed_weights(
    stream: Iterable[tuple[str, CheckpointTensor]],
) -> Iterator[tuple[str, CheckpointTensor]]:
    """Yield each packed weight once its side tensors have all arrived; pass the rest through.

    :raises CheckpointFormatError: naming the tensor, when a packed weight
        lacks a side tensor, a side tensor has no packed weight, a quant state
        is corrupt, or a piece arrives after its weight was complete.
    """
    import torch

    pending: dict[str, _Pending] = {}
    done: set[str] = set()
    for name, tensor in stream:
        side = _split_side_name(name)
        if side is None and not (name.endswith(".weight") and tensor.dtype == torch.uint8):
            yield name, tensor
            continue
        base, role = side if side is not None else (name, "weight")
        if base in done:
            raise CheckpointFormatError(
                f"{tensor.describe()}: belongs to the bitsandbytes weight {base!r}, which was already "
                "complete without it (a nested tensor without double quantization, or a duplicate)"
            )
        entry = pending.setdefault(base, _Pending())
        if entry.first_seen is None:
            entry.first_seen = tensor
        if role in entry.tensors:
            raise CheckpointFormatError(f"{tensor.describe()}: a second {role} for {base!r}")
        entry.tensors[role] = tensor
        if role == "quant_state":
            entry.header = parse_quant_state(tensor.read(), name, tensor.describe())
        if not entry.needed():
            del pending[base]
            done.add(base)
            yield base, entry.build()
    for base, entry in pending.items():
        missing = entry.needed()
        seen = entry.tensors.get("weight", entry.first_seen)
        assert seen is not None
        if "weight" in missing:
            raise CheckpointFormatError(
                f"{seen.describe()}: bitsandbytes quant state for {base!r}, but the checkpoint has no "
                f"packed uint8 tensor {base!r}"
            )
        names = ", ".join(repr(f"{base}.{r}" if r != "quant_state" else f"{base}.{QUANT_STATE_PREFIX}*")
                          for r in missing)
        raise CheckpointFormatError(
            f"{seen.describe()}: packed 4-bit weight {base!r} has no {names} in the checkpoint"
        )
