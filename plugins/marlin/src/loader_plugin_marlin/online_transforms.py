"""compressed-tensors online rotations (``transform_config``): Hadamard transforms applied to a layer's input.

QuIP and SpinQuant rotate weights and activations so that quantization sees
fewer outliers. A rotation fused into the stored weights (locations
``weight_input``/``weight_output``) needs nothing at load; one applied to the
activations while the model runs (location ``input``: QuIP's ``v``,
SpinQuant's R4 before ``down_proj``) does. llm-compressor stores its matrix
once per size, under the first module that uses it
(``model.layers.0.mlp.down_proj.R4_input.weight``, float64, entries ±1 for
``hadamard`` and random signs for ``random-hadamard``), and every targeted
linear multiplies its input by it in its forward:
``x -> (x @ H) / sqrt(n)`` (``H.T`` with ``inverse``), per head when the
scheme gives a ``head_dim`` — as compressed-tensors' ``HadamardTransform``
does. The matrix is kept once per size, scaled and in float32 (the scheme's
float64 ``precision`` changes the result by ~1e-7 relative).

Other online locations (``output``, the attention's ``q_attn``/``k_cache`` of
SpinQuant R3), randomized permutations and other transform types are refused
by name. A row-parallel layer split over ranks holds part of its input only; a
rotation wider than that part gathers the whole input from the ranks first
(one all-gather per layer and step) and keeps its own columns of the result.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import torch
from torch import nn

from loader.errors import CheckpointFormatError, ConfigError, UnsupportedError
from loader.layers import LinearBase, RowParallelLinear
from loader.models import all_gather

__all__ = ["OnlineTransform", "attach_online_transforms", "online_transforms", "transform_tensor_group"]

_WHERE = "config.json quantization_config transform_config"
_TYPES = ("hadamard", "random-hadamard")
_OFFLINE = ("weight_input", "weight_output")


@attrs.frozen
class OnlineTransform:
    """One ``apply`` entry of a transform group that runs on a layer's input."""

    group: str
    targets: tuple[str, ...]
    ignore: tuple[str, ...]
    inverse: bool
    head_dim: int | None

    def matches(self, name: str, classes: tuple[str, ...]) -> bool:
        def hit(entry: str) -> bool:
            if entry.startswith("re:"):
                return re.match(entry[3:], name) is not None
            return entry == name or entry in classes

        return any(hit(t) for t in self.targets) and not any(hit(i) for i in self.ignore)


def _entries(group: str, scheme: Mapping[str, Any]) -> list[OnlineTransform]:
    where = f"{_WHERE}.config_groups.{group}"
    if scheme.get("type") not in _TYPES:
        raise UnsupportedError(f"{where}: transform type {scheme.get('type')!r} is not supported; expected one of "
                               f"{list(_TYPES)}")
    if scheme.get("randomize"):
        raise UnsupportedError(f"{where}: randomize (permuted Hadamard rows) is not supported")
    head_dim = scheme.get("head_dim")
    if head_dim is not None and (isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0):
        raise ConfigError(f"{where}: head_dim must be a positive integer or null, found {head_dim!r}")
    found = []
    for entry in scheme.get("apply") or []:
        location = entry.get("location") if isinstance(entry, Mapping) else None
        if location in _OFFLINE:
            continue  # already in the stored weights
        if location != "input":
            raise UnsupportedError(f"{where}: an online rotation at location {location!r} is not supported; only "
                                   "'input' (and rotations fused into the weights)")
        found.append(OnlineTransform(group, tuple(entry.get("targets") or ()), tuple(entry.get("ignore") or ()),
                                     bool(entry.get("inverse", False)), head_dim))
    return found


def online_transforms(transform_config: Mapping[str, Any] | None) -> tuple[OnlineTransform, ...]:
    """The rotations to apply to layer inputs; every unsupported feature is refused by name."""
    if not transform_config:
        return ()
    groups = transform_config.get("config_groups")
    if not isinstance(groups, Mapping):
        raise ConfigError(f"{_WHERE}: config_groups must be an object, found {groups!r}")
    return tuple(t for group, scheme in groups.items() for t in _entries(str(group), scheme))


def transform_tensor_group(name: str, transforms: tuple[OnlineTransform, ...]) -> str | None:
    """The group of a stored rotation matrix (``...down_proj.R4_input.weight`` -> ``R4``), or ``None``."""
    for transform in transforms:
        if name.endswith(f".{transform.group}_input.weight"):
            return transform.group
    return None


def _input_rotation(matrix: torch.Tensor, inverse: bool, shard: tuple[int, int] | None
                    ) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
    """The forward pre-hook; ``shard``: ``(start, length)`` of this rank's input columns when the rotation spans
    more than them (a row-parallel layer at tp > 1): the whole input is gathered, rotated and cut again."""
    rotation = (matrix.t() if inverse else matrix).to(torch.float32) / math.sqrt(matrix.shape[0])
    size = rotation.shape[0]

    def rotate(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        x = args[0]
        whole = all_gather(x, dim=-1) if shard is not None else x
        heads = whole.shape[-1] // size
        y = (whole.to(torch.float32).unflatten(-1, (heads, size)) @ rotation.to(x.device)).flatten(-2, -1)
        if shard is not None:
            y = y.narrow(-1, shard[0], shard[1])
        return (y.to(x.dtype), *args[1:])

    return rotate


def _transform_of(layer: LinearBase, names: list[str], transforms: tuple[OnlineTransform, ...]
                  ) -> OnlineTransform | None:
    chosen = {name: next((t for t in transforms if t.matches(name, ("Linear",))), None) for name in names}
    if len(set(chosen.values())) > 1:
        raise UnsupportedError(f"{_WHERE}: the parts of {layer.prefix} get different online rotations "
                               f"{ {n: t.group if t else None for n, t in chosen.items()} }; they share one input")
    return next(iter(chosen.values()))


def attach_online_transforms(model: nn.Module, transforms: tuple[OnlineTransform, ...],
                             matrices: Mapping[str, torch.Tensor], packed: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Rotate the input of every linear layer a transform targets; return the layers rotated."""
    by_size: dict[tuple[str, int], torch.Tensor] = {}
    for name, matrix in matrices.items():
        group = transform_tensor_group(name, transforms)
        if group is not None:
            by_size[group, int(matrix.shape[0])] = matrix
    rotated = []
    for path, layer in model.named_modules():
        if not isinstance(layer, LinearBase):
            continue
        prefix = layer.prefix or path
        parent, _, leaf = prefix.rpartition(".")
        names = [f"{parent}.{part}" if parent else part for part in packed.get(leaf, ())] or [prefix]
        transform = _transform_of(layer, names, transforms)
        if transform is None:
            continue
        size = transform.head_dim or layer.input_size
        if (transform.group, size) not in by_size:
            raise CheckpointFormatError(f"{_WHERE}: {prefix} is rotated by {transform.group!r}, but the checkpoint "
                                        f"has no {transform.group}_input.weight of size {size}")
        local = layer.input_size_per_partition
        split = isinstance(layer, RowParallelLinear) and layer.tp_size > 1 and local % size != 0
        shard = (layer.tp_rank * local, local) if split else None
        layer.register_forward_pre_hook(_input_rotation(by_size[transform.group, size], transform.inverse, shard))
        rotated.append(prefix)
    return rotated
