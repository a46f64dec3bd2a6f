"""Tensor parallelism for transformers' fused experts: each rank holds its rows of every expert.

transformers' MoE blocks keep all experts in 3-D parameters
(``gate_up_proj`` ``[experts, 2 * intermediate, hidden]``, ``down_proj``
``[experts, hidden, intermediate]``), and their configs' ``base_model_tp_plan``
says how they split: ``packed_colwise`` (each of gate and up split by rows),
``colwise`` (rows), ``rowwise`` (columns), with the experts module marked
``moe_tp_experts`` (its output is a partial sum). The fallback replaces those
parameters by this rank's share and all-reduces the module's output, as the
native layers do; the expert forward itself is transformers' (it splits its
gate/up output in two halves, whatever their size). Each rank reads only its
rows of each expert's checkpoint tensor (:meth:`ShardedExperts.local_parts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch import nn

from loader.errors import UnsupportedError
from loader.models import all_reduce, current_session, divide

from .parallel import plan_style

if TYPE_CHECKING:
    from loader.weights import CheckpointTensor

    from .conversion_ops import Piece

__all__ = ["EXPERTS_STYLE", "ShardedExperts", "shard_experts"]

EXPERTS_STYLE = "moe_tp_experts"
_PARTS = {"packed_colwise": (2, -2), "colwise": (1, -2), "rowwise": (1, -1)}
"""plan style -> (equal parts the dim holds, the dim split)."""


@attrs.frozen
class ShardedExperts:
    """A fused expert parameter of which this rank holds ``1 / tp`` of each part along ``dim``."""

    whole_shape: tuple[int, ...]
    dim: int
    parts: int
    rank: int
    tp: int

    @property
    def local_shape(self) -> tuple[int, ...]:
        shape = list(self.whole_shape)
        shape[self.dim] //= self.tp
        return tuple(shape)

    def local_parts(self, piece: Piece, tensor: CheckpointTensor) -> list[tuple[tuple[tuple[int, int], ...],
                                                                               CheckpointTensor]]:
        """This rank's share of ``piece``: ``(region in the local parameter, the input narrowed to it)``."""
        start, length = piece.region[self.dim]
        tensor_dim = sum(1 for d in piece.dims[:self.dim] if d is not None)
        part = self.whole_shape[self.dim] // self.parts
        share = part // self.tp
        out = []
        for index in range(self.parts):
            owned = index * part + self.rank * share
            low, high = max(start, owned), min(start + length, owned + share)
            if low >= high:
                continue
            region = list(piece.region)
            region[self.dim] = (index * share + low - owned, high - low)
            out.append((tuple(region), tensor.narrow(tensor_dim, low - start, high - low)))
        return out


def _all_reduce_output(module: nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
    return all_reduce(output)


def shard_experts(hf_model: nn.Module, plan: Mapping[str, str], *, architecture: str) -> dict[str, ShardedExperts]:
    """Replace the fused expert parameters of every ``moe_tp_experts`` module by this rank's share.

    Returns the sharded parameters by name. Raises :class:`~loader.errors.UnsupportedError` naming the
    parameter when the plan gives it no style this supports or its dim does not split evenly, and for
    ``enable_expert_parallel`` (whole experts per rank), which the fallback does not do.
    """
    session = current_session()
    base_prefix = str(getattr(hf_model, "base_model_prefix", "") or "")
    sharded: dict[str, ShardedExperts] = {}
    for name, module in list(hf_model.named_modules()):
        relative = name.removeprefix(f"{base_prefix}.") if base_prefix else name
        if plan_style(relative, plan) != EXPERTS_STYLE:
            continue
        if session.enable_expert_parallel:
            raise UnsupportedError(
                f"{architecture}: enable_expert_parallel places whole experts on ranks, which the transformers "
                "fallback does not do (it splits every expert's rows over the ranks); load it without "
                "enable_expert_parallel, or through a native model plugin"
            )
        for leaf, param in list(module.named_parameters(recurse=False)):
            style = plan_style(f"{relative}.{leaf}", plan)
            if style not in _PARTS:
                raise UnsupportedError(
                    f"{architecture}: base_model_tp_plan gives {relative}.{leaf} the style {style!r}; the transformers "
                    f"fallback shards fused experts only as {', '.join(_PARTS)}; load it with tp=1"
                )
            parts, dim = _PARTS[style]
            dim %= param.ndim
            divide(param.shape[dim] // parts, session.tp_size, f"{architecture}: {relative}.{leaf} rows per part")
            record = ShardedExperts(tuple(param.shape), dim, parts, session.tp_rank, session.tp_size)
            local = nn.Parameter(torch.empty(record.local_shape, dtype=param.dtype, device=param.device),
                                 requires_grad=False)
            setattr(module, leaf, local)
            sharded[f"{name}.{leaf}"] = record
        module.register_forward_hook(_all_reduce_output)
    return sharded
