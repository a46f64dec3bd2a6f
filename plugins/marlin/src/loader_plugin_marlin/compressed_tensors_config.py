"""compressed-tensors checkpoints as llm-compressor writes them: every config group, its targets, the ignore list.

``quantization_config`` (``quant_method: "compressed-tensors"``) holds
``config_groups``: each a scheme (``weights``, ``input_activations``, a
``format`` of its own or the config's) and the ``targets`` it applies to —
module class names (``Linear``: every linear layer and the output head;
``Embedding``), exact module names and ``re:`` patterns (``re.match`` on the
module's dotted name). A layer takes the group of its most specific match, as
compressed-tensors orders them (exact name, then pattern, then class); a fused
layer (q/k/v, gate/up, an expert layer) is matched by its parts' checkpoint
names, which must agree. ``ignore`` (names, patterns) keeps modules in floating
point. Each group's format builds that group's own quantization config
(:data:`FORMAT_SCHEMES`: ``pack-quantized`` the packed-integer method,
``float-quantized`` FP8, ``int-quantized``/``naive-quantized`` int8, the FP4
formats; ``dense``, saved uncompressed, quantizes integer weights at load as
compressed-tensors' forward would), so several groups give mixed precision per
layer.

A target that matches no layer of the model is an error (a pattern written for
another model, or a typo), raised before any weight is read. The scales of an
FP8 KV cache (``kv_cache_scheme``: ``self_attn.k_scale``/``v_scale``) are
taken from the stream and, once the model is loaded, given to its attention
layers (:mod:`~loader_plugin_marlin.kv_cache_scales`), which round keys and
values as that cache does; the matrices of online rotations (``transform_config``)
likewise go to the layers whose input they rotate
(:mod:`~loader_plugin_marlin.online_transforms`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch

from loader.errors import ConfigError, UnsupportedError
from loader.layers import FusedMoE, LinearBase, ParallelLMHead, QuantizationConfig, VocabParallelEmbedding

from .compressed_tensors_format import pack_quantized_scheme
from .config import kernel_option
from .dense_frozen_format import dense_frozen_scheme
from .fp4_config import fp4_scheme_from_ct
from .fp8_config import fp8_scheme_from_ct
from .int8_config import int8_scheme_from_ct
from .online_transforms import OnlineTransform, online_transforms, transform_tensor_group

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import QuantizeMethodBase
    from loader.weights import CheckpointTensor, WeightStream

__all__ = ["FORMAT_SCHEMES", "CompressedTensorsConfig", "SchemeGroup", "ct_config_from_checkpoint"]

METHOD_NAME = "compressed-tensors"
_WHERE = "config.json quantization_config"
SchemeFactory = Callable[[str, Mapping[str, Any], Mapping[str, Any] | None], QuantizationConfig]

FORMAT_SCHEMES: dict[str, SchemeFactory] = {
    "pack-quantized": pack_quantized_scheme,
    "float-quantized": fp8_scheme_from_ct,
    "int-quantized": int8_scheme_from_ct,
    "naive-quantized": int8_scheme_from_ct,
    "nvfp4-pack-quantized": fp4_scheme_from_ct,
    "mxfp4-pack-quantized": fp4_scheme_from_ct,
}
"""Each ``format`` this plugin loads → the factory of one group's config (``dense`` is handled apart)."""

DENSE = "dense"
_KV_SCALES = (".k_scale", ".v_scale")
_DENSE_EXTRAS = ("weight_scale", "weight_zero_point", "weight_g_idx", "input_scale", "input_zero_point",
                 "output_scale", "output_zero_point", "weight_global_scale", "input_global_scale")


@attrs.frozen
class SchemeGroup:
    """One entry of ``config_groups``: its name, targets, format, (``None`` for ``dense``) its config, and how
    ``loader inspect`` sums it up (``w4 int group 32 asym``)."""

    name: str
    targets: tuple[str, ...]
    format: str
    config: QuantizationConfig | None
    summary: str = ""


def _class_names(layer: nn.Module) -> tuple[str, ...]:
    """The compressed-tensors class names ``layer`` answers to (transformers builds these as ``nn.Linear`` and
    ``nn.Embedding``)."""
    if isinstance(layer, (LinearBase, ParallelLMHead, FusedMoE)):
        return ("Linear",)
    if isinstance(layer, VocabParallelEmbedding):
        return ("Embedding",)
    return ()


def _name_matches(target: str, name: str) -> bool:
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return target == name


@attrs.frozen
class CompressedTensorsConfig(QuantizationConfig):
    """A compressed-tensors checkpoint: its groups in config order, the ``ignore`` list, the KV cache scheme.

    :ivar matched: each target that matched a layer while the model was built, ``(group, target)``.
    :ivar kv_scales: the KV cache scales taken from the checkpoint, by tensor name.
    :ivar transforms: the rotations applied to layer inputs (``transform_config``).
    :ivar kv_attached: the attention layers given KV cache scales after loading.
    :ivar transform_matrices: the stored rotation matrices, taken from the stream.
    :ivar rotated: the layers whose input is rotated.
    :ivar dense_modules: the checkpoint modules of groups that quantize nothing (their saved observer tensors
        are set aside).
    """

    name: ClassVar[str] = METHOD_NAME

    groups: tuple[SchemeGroup, ...]
    ignore: tuple[str, ...] = ()
    kv_cache_scheme: Mapping[str, Any] | None = None
    transforms: tuple[OnlineTransform, ...] = ()
    matched: set[tuple[str, str]] = attrs.field(factory=set, eq=False, repr=False)
    kv_scales: dict[str, float] = attrs.field(factory=dict, eq=False, repr=False)
    dense_modules: set[str] = attrs.field(factory=set, eq=False, repr=False)
    layer_groups: dict[str, SchemeGroup] = attrs.field(factory=dict, eq=False, repr=False)
    kv_attached: list[str] = attrs.field(factory=list, eq=False, repr=False)
    transform_matrices: dict[str, torch.Tensor] = attrs.field(factory=dict, eq=False, repr=False)
    rotated: list[str] = attrs.field(factory=list, eq=False, repr=False)

    def ignores(self, prefix: str) -> bool:
        self._note_name_matches(prefix)
        return any(_name_matches(entry, prefix) or (not entry.startswith("re:") and f".{entry}." in f".{prefix}.")
                   for entry in self.ignore)

    def _note_name_matches(self, name: str) -> None:
        for group in self.groups:
            for target in group.targets:
                if _name_matches(target, name):
                    self.matched.add((group.name, target))

    def _group_of(self, name: str, classes: tuple[str, ...]) -> SchemeGroup | None:
        """The group of checkpoint module ``name``: an exact name target first, then a pattern, then a class."""
        for kind in ("name", "pattern", "class"):
            for group in self.groups:
                for target in group.targets:
                    is_pattern = target.startswith("re:")
                    hit = (target in classes if kind == "class" else
                           (is_pattern == (kind == "pattern")) and _name_matches(target, name))
                    if hit:
                        self.matched.add((group.name, target))
                        return group
        return None

    def _checkpoint_names(self, layer: nn.Module, prefix: str) -> list[str]:
        if isinstance(layer, FusedMoE):
            return [f"{prefix}.{expert}.{part}" for expert in range(layer.num_experts)
                    for part in layer.names.by_part.values()]
        parent, _, leaf = prefix.rpartition(".")
        parts = self.packed_modules.get(leaf, ())
        return [f"{parent}.{part}" if parent else part for part in parts] or [prefix]

    def group_for(self, layer: nn.Module, prefix: str) -> SchemeGroup | None:
        """The one group every checkpoint module of layer ``prefix`` belongs to (``None``: no target matches)."""
        classes = _class_names(layer)
        found = {name: self._group_of(name, classes) for name in self._checkpoint_names(layer, prefix)}
        chosen = {group.name if group else None for group in found.values()}
        if len(chosen) > 1:
            shown = {name: group.name if group else None for name, group in found.items()}
            raise UnsupportedError(f"{_WHERE}: config_groups give the parts of {prefix} different schemes {shown}; "
                                   "they share one fused weight")
        return next(iter(found.values()))

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The method of the layer's group's config; ``None`` (floating point) for no group or a ``dense`` one."""
        if not _class_names(layer):
            return None
        group = self.group_for(layer, prefix)
        if group is not None:
            self.layer_groups[prefix] = group
        if group is not None and group.config is None:
            self.dense_modules.update(self._checkpoint_names(layer, prefix))
        if group is None or group.config is None:
            return None
        group.config.set_packed_modules(self.packed_modules)
        method = group.config.get_quant_method(layer, prefix)
        if method is None and _class_names(layer) == ("Embedding",):
            raise UnsupportedError(f"{_WHERE}: config_groups.{group.name} quantizes the embedding {prefix} "
                                   f"({group.format}), which is not supported; keep it in 'ignore'")
        return method

    def layer_scheme(self, prefix: str) -> str | None:
        """``"<group>: <format> <summary>"`` of the layer's group (``None``: no group, left in floating point)."""
        group = self.layer_groups.get(prefix)
        return f"{group.name}: {group.format} {group.summary}".rstrip() if group is not None else None

    def unmatched_targets(self) -> list[tuple[str, str]]:
        """Name and pattern targets that matched no module of the model built (class targets may match none)."""
        return [(group.name, target) for group in self.groups for target in group.targets
                if (group.name, target) not in self.matched and ("re:" in target or "." in target)]

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        """Refuse targets that matched nothing, before any weight is read; take the KV cache scales aside."""
        unmatched = self.unmatched_targets()
        if unmatched:
            shown = ", ".join(f"config_groups.{group}.targets {target!r}" for group, target in unmatched)
            raise ConfigError(f"{_WHERE}: {shown} matches no module of the model; a target written for another "
                              "model, or misspelt, would leave its layers unquantized")
        return self._without_extras(weights)

    def _without_extras(self, weights: WeightStream) -> Iterator[tuple[str, CheckpointTensor]]:
        for name, tensor in weights:
            if self.kv_cache_scheme is not None and name.endswith(_KV_SCALES):
                self.kv_scales[name] = float(tensor.read().float().reshape(-1)[0])
                continue
            if transform_tensor_group(name, self.transforms) is not None:
                self.transform_matrices[name] = tensor.read()
                continue
            module, _, leaf = name.rpartition(".")
            if leaf in _DENSE_EXTRAS and module in self.dense_modules:
                continue  # a dense group's saved quantization parameters: its weights are already floats
            yield name, tensor

    def describe(self) -> dict[str, Any]:
        kernels: dict[str, int] = {}
        layers: dict[str, Any] = {}
        groups: dict[str, Any] = {}
        packed_cache = None  # the groups share the load's bundle
        for group in self.groups:
            described: dict[str, Any] = group.config.describe() if group.config is not None else {"method": DENSE}
            packed_cache = described.pop("packed_cache", None) or packed_cache
            groups[group.name] = {"targets": list(group.targets), "format": group.format, **described}
            for kernel, count in dict(described.get("kernels") or {}).items():
                kernels[kernel] = kernels.get(kernel, 0) + count
            layers.update(dict(described.get("layers") or {}))
        for prefix, record in layers.items():  # as `loader inspect --layers` shows them
            scheme = self.layer_scheme(prefix)
            if scheme is not None and isinstance(record, dict):
                layers[prefix] = {**record, "scheme": scheme}
        kv = None
        if self.kv_cache_scheme is not None:
            kv = {"scheme": dict(self.kv_cache_scheme), "scales": len(self.kv_scales),
                  "applied": len(self.kv_attached), "note": "keys and values rounded to FP8 under the scales, "
                  "kept in the model's dtype"}
        return {"method": self.name, "groups": groups, "ignore": list(self.ignore), "kernels": kernels,
                "layers": dict(sorted(layers.items())), "kv_cache": kv, "packed_cache": packed_cache,
                "online_rotations": {"groups": sorted({t.group for t in self.transforms}),
                                     "layers": len(self.rotated)} if self.transforms else None}


def _patterns(value: Any, key: str) -> tuple[str, ...]:
    """A list of class names, module names and ``re:`` patterns, each pattern compiled once to name a bad one."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{_WHERE}: {key} must be a list of module names, class names or 're:' patterns, "
                          f"found {value!r}")
    for entry in value:
        if entry.startswith("re:"):
            try:
                re.compile(entry[3:])
            except re.error as exc:
                raise ConfigError(f"{_WHERE}: {key} entry {entry!r} is not a regular expression: {exc}") from exc
    return tuple(value)


def _refuse_unsupported_features(declared: Mapping[str, Any]) -> None:
    """Features that change what the stored tensors mean, named rather than loaded wrongly."""
    sparsity = declared.get("sparsity_config")
    if isinstance(sparsity, Mapping) and sparsity.get("format") not in (None, DENSE):
        raise UnsupportedError(f"{_WHERE}: sparsity_config format {sparsity.get('format')!r} (compressed 2:4 "
                               "sparse weights) is not supported; a 2:4-pruned checkpoint saved dense loads")


def _summary(scheme: Mapping[str, Any]) -> str:
    """``w4 int group 32 asym, a8 int token dynamic`` from a scheme's ``weights`` and ``input_activations``."""
    parts = []
    for letter, key in (("w", "weights"), ("a", "input_activations")):
        args = scheme.get(key)
        if not isinstance(args, Mapping):
            continue
        strategy = str(args.get("strategy"))
        if strategy == "group":
            strategy = f"group {args.get('group_size')}"
        elif strategy == "block":
            strategy = f"block {args.get('block_structure')}"
        text = f"{letter}{args.get('num_bits')} {args.get('type')} {strategy}"
        text += "" if args.get("symmetric", True) else " asym"
        parts.append(text + (" dynamic" if args.get("dynamic") is True else ""))
    return ", ".join(parts)


def _group(name: str, scheme: Any, global_format: Any, options: Mapping[str, Any] | None) -> SchemeGroup:
    if not isinstance(scheme, Mapping):
        raise ConfigError(f"{_WHERE}: config_groups.{name} must be an object, found {scheme!r}")
    targets = _patterns(scheme.get("targets"), f"config_groups.{name}.targets")
    if not targets:
        raise ConfigError(f"{_WHERE}: config_groups.{name}.targets is empty; name the layers the scheme applies to")
    fmt = scheme.get("format") or global_format
    if fmt == DENSE:
        return SchemeGroup(name, targets, DENSE, dense_frozen_scheme(name, scheme, options), _summary(scheme))
    factory = FORMAT_SCHEMES.get(fmt) if isinstance(fmt, str) else None
    if factory is None:
        known = sorted([*FORMAT_SCHEMES, DENSE])
        raise UnsupportedError(f"{_WHERE}: config_groups.{name}: compressed-tensors format {fmt!r} is not "
                               f"supported; expected one of {known}")
    return SchemeGroup(name, targets, fmt, factory(name, scheme, options), _summary(scheme))


def ct_config_from_checkpoint(declared: Mapping[str, Any],
                              options: Mapping[str, Any] | None = None) -> CompressedTensorsConfig:
    """The config of a compressed-tensors checkpoint: each group built by its format's factory, every bad field
    named."""
    _refuse_unsupported_features(declared)
    declared_groups = declared.get("config_groups")
    if not isinstance(declared_groups, Mapping) or not declared_groups:
        raise ConfigError(f"{_WHERE}: config_groups must name at least one scheme, found {declared_groups!r}")
    groups = tuple(_group(str(name), scheme, declared.get("format"), options)
                   for name, scheme in declared_groups.items())
    if all(group.config is None for group in groups):
        kernel_option(options, METHOD_NAME)  # the options are checked although no layer uses them
    kv_cache = declared.get("kv_cache_scheme")
    if kv_cache is not None and not isinstance(kv_cache, Mapping):
        raise ConfigError(f"{_WHERE}: kv_cache_scheme must be an object or null, found {kv_cache!r}")
    return CompressedTensorsConfig(groups=groups, ignore=_patterns(declared.get("ignore") or [], "ignore"),
                                   kv_cache_scheme=kv_cache,
                                   transforms=online_transforms(declared.get("transform_config")))
