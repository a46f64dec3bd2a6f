"""Each GGUF layer's kernel from the file's header alone, for ``loader inspect --layers``.

A GGUF layer's kernel depends on the block types of the tensors it is filled
from (Q4_0/Q4_1/Q4_K stay packed, others are dequantized), which the header
holds. A plan hands the layer's own ``weight_loader`` the checkpoint tensors a
load hands it — named by the load's own stream
(:meth:`~loader_plugin_gguf.packed.config.GGUFQuantConfig.header_tensors`),
routed to fused layers through the model's ``packed_modules_mapping`` as the
model plugins route them, narrowed to this rank by the layer — so the quantize
method decides from the same narrowed parts it decides from at load. Nothing
is read: a narrowed GGUF tensor is a window over header entries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import torch

from loader.layers import LinearBase, weight_loader_of

from .q4_blocks import GROUP_SIZE

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import ShardId
    from loader.weights import CheckpointTensor

    from .config import GGUFQuantConfig

__all__ = ["fill_from_header", "header_sources", "int4_packed_bytes"]


def header_sources(config: GGUFQuantConfig, layer: nn.Module) -> list[tuple[ShardId, CheckpointTensor]] | None:
    """The checkpoint tensors a load hands ``layer``, with their shard ids; ``None`` when one is not in the file.

    A layer named in the checkpoint (``o_proj``, ``embed_tokens``) takes its
    own ``.weight``; a fused one (``qkv_proj``) takes its parts in the order
    ``packed_modules_mapping`` lists them, paired with the layer's shard ids
    (what the model plugins' stacked mapping does).
    """
    tensors = config.header_tensors()
    prefix = str(getattr(layer, "prefix", ""))
    whole = tensors.get(f"{prefix}.weight")
    if whole is not None:
        return [(None, whole)]
    parent, _, leaf = prefix.rpartition(".")
    names = config.packed_modules.get(leaf, ())
    ids = layer.shard_ids() if isinstance(layer, LinearBase) else [None]
    if not names or len(names) != len(ids):
        return None
    found = [tensors.get(f"{parent}.{name}.weight" if parent else f"{name}.weight") for name in names]
    if any(tensor is None for tensor in found):
        return None
    return [(shard_id, cast("CheckpointTensor", tensor)) for shard_id, tensor in zip(ids, found, strict=True)]


def fill_from_header(config: GGUFQuantConfig, layer: nn.Module) -> bool:
    """Hand ``layer``'s weight loader its tensors as a load does (the method only records the narrowed parts).

    False when the file lacks one of them. The caller clears what its method
    recorded once it has decided.
    """
    sources = header_sources(config, layer)
    if sources is None:
        return False
    weight = cast(torch.Tensor, layer.weight)
    for shard_id, tensor in sources:
        weight_loader_of(weight)(weight, tensor, shard_id)
    return True


def int4_packed_bytes(rows: int, cols: int, dtype: torch.dtype) -> int:
    """Bytes of torch's packed int4 weight ``[rows, cols]``: two codes a byte, a scale and a zero per 32-group."""
    return rows * cols // 2 + cols // GROUP_SIZE * rows * 2 * dtype.itemsize
