"""The quantization configs of packed-integer checkpoints, and the pieces they share.

GPTQ, AWQ and compressed-tensors ``pack-quantized`` checkpoints describe the
same settings in different words: bits, a group size (-1: one group over
the whole input), act-order (``g_idx`` maps input rows to groups in any
order), symmetric or not. :class:`PackedQuantConfig` holds them, the kernel
the user asked for, the modules kept dense, and the per-layer kernel choices
made after loading (:attr:`PackedQuantConfig.kernel_log`, shown by ``loader
load --json``). Each format's subclass adds what only it has and names its
:class:`~loader_plugin_marlin.param_specs.CheckpointLayout`.

This module holds GPTQ's config (AWQ's and compressed-tensors' live beside
their layouts). It imports the quantize method it hands out (and torch with
it); the entry point imports it, through :mod:`.detection`, only for a load
whose checkpoint declares one of these methods.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.kernels import dense_budget, exact_float32_default
from loader.layers import FusedMoE, LinearBase, ParallelLMHead, QuantizationConfig

from .fused_moe_method import PackedFusedMoEMethod
from .gptq_format import GPTQLayout
from .kernel_paths import DenseBudget
from .linear_method import PackedLinearMethod
from .packed_cache import PackedCacheSlot

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import QuantizeMethodBase

    from .param_specs import CheckpointLayout

__all__ = ["BITS", "CHECKPOINT_FORMATS", "KERNELS", "METHOD_NAME", "DynamicRule", "GPTQConfig", "PackedQuantConfig",
           "check_flag", "config_from_checkpoint", "exact_float32_option", "kernel_option", "module_list"]

METHOD_NAME = "gptq"
BITS = (4, 8)
GROUP_SIZES = (-1, 16, 32, 64, 128, 256, 512, 1024)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
KERNELS = ("auto", "marlin", "int4pack", "int8pack", "dequantize")
OPTIONS = ("kernel", "exact_float32")
"""The ``quantization_options`` keys these formats take (``exact_float32``: :func:`exact_float32_option`)."""
"""``auto`` picks per layer (Marlin on CUDA, the packed kernels on CPU); the others force one kernel (layers it
cannot take fall back to ``dequantize``, with the reason)."""


def _matches(prefix: str, module: str) -> bool:
    """Whether dotted ``module`` names ``prefix`` or one of its parents, by whole components."""
    return f".{module}." in f".{prefix}."


@attrs.frozen
class PackedQuantConfig(QuantizationConfig):
    """Settings every packed-integer format shares (subclass per format).

    :ivar bits: 4 or 8 bits per weight.
    :ivar group_size: input rows sharing one scale and zero point; -1 for one group over all of them.
    :ivar act_order: ``g_idx`` maps each input row to its group in an arbitrary order.
    :ivar sym: symmetric quantization (zero point ``2**(bits-1)``).
    :ivar kernel: ``quantization_options["kernel"]``, see :data:`KERNELS`.
    :ivar skip_modules: modules the checkpoint keeps in floating point.
    :ivar lm_head: the checkpoint quantizes the output head too (GPTQ ``lm_head: true``).
    :ivar kernel_log: each quantized layer's :class:`~loader.kernels.KernelChoice`, filled after loading.
    :ivar exact_float32: ``quantization_options["exact_float32"]``: a float32 load keeps float32 scales and
        only paths that compute in float32 (:mod:`~loader_plugin_marlin.kernel_paths`).
    :ivar dense_budget: the bytes of dequantized copies this load may still keep (``LOADER_KERNEL_DENSE_BUDGET``).
    """

    bits: int = 4
    group_size: int = 128
    act_order: bool = False
    sym: bool = True
    kernel: str = "auto"
    skip_modules: tuple[str, ...] = ()
    lm_head: bool = False
    kernel_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False, repr=False)
    packed_cache: PackedCacheSlot = attrs.field(factory=PackedCacheSlot, eq=False, repr=False)
    """Where the layers find the load's packed-weights bundle (:mod:`~loader_plugin_marlin.packed_cache`)."""
    exact_float32: bool = False
    dense_budget: DenseBudget = attrs.field(factory=lambda: DenseBudget(dense_budget()), eq=False,
                                            repr=False)

    @property
    def pack_factor(self) -> int:
        """Codes per stored int32."""
        return 32 // self.bits

    @property
    def layout(self) -> CheckpointLayout:
        """This format's tensors per layer."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for choice in self.kernel_log.values():
            counts[choice.kernel] = counts.get(choice.kernel, 0) + 1
        return {
            "method": self.name, "bits": self.bits, "group_size": self.group_size, "act_order": self.act_order,
            "sym": self.sym, "kernel": self.kernel, "exact_float32": self.exact_float32,
            "skip_modules": list(self.skip_modules), "lm_head": self.lm_head,
            "kernels": counts,
            "layers": {prefix: choice.record() for prefix, choice in sorted(self.kernel_log.items())},
            "packed_cache": self.packed_cache.describe(),
        }

    def ignores(self, prefix: str) -> bool:
        return any(_matches(prefix, m) for m in self.skip_modules)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~loader_plugin_marlin.linear_method.PackedLinearMethod` for every parallel linear layer, and for
        the output head when the checkpoint quantizes it (:attr:`lm_head`);
        :class:`~loader_plugin_marlin.fused_moe_method.PackedFusedMoEMethod` for fused experts.

        Routers (``mlp.gate``) and Qwen2-MoE's ``shared_expert_gate`` are
        built without a quantization config, so they stay dense whatever the
        skip list says, as GPTQModel and llm-compressor write them.
        """
        if isinstance(layer, FusedMoE):
            return self._experts_method(layer, prefix)
        if not (isinstance(layer, LinearBase) or (self.lm_head and isinstance(layer, ParallelLMHead))):
            return None
        return PackedLinearMethod(self)

    def _experts_method(self, layer: FusedMoE, prefix: str) -> PackedFusedMoEMethod | None:
        """The experts' method, dense when the skip list names every expert part; naming only some is refused
        (the experts share one weight per part)."""
        names = [f"{prefix}.{expert}.{part}" for expert in range(layer.num_experts)
                 for part in layer.names.by_part.values()]
        skipped = [name for name in names if self.ignores(name)]
        if skipped and len(skipped) < len(names):
            raise UnsupportedError(
                f"{_WHERE}: keeps {skipped[0]} unquantized but quantizes other experts of {prefix} "
                f"({len(skipped)} of {len(names)} expert parts skipped); their parts share one fused weight")
        if skipped:
            return None
        return PackedFusedMoEMethod(self.for_modules(names, prefix))

    def for_modules(self, names: Sequence[str], prefix: str) -> PackedQuantConfig:
        """This config as it applies to the checkpoint modules ``names`` fused into layer ``prefix`` (they must
        agree); the base has no per-module settings."""
        return self


_DYNAMIC_FIELDS = {"bits": "bits", "group_size": "group_size", "sym": "sym", "desc_act": "act_order"}


@attrs.frozen
class DynamicRule:
    """One entry of GPTQModel's ``dynamic`` (vLLM reads it the same way): modules whose dotted name matches
    ``pattern`` (``re.match``) are kept dense (a ``-:`` key) or quantized with ``overrides`` (``+:`` or no prefix).

    :ivar overrides: ``(field, value)`` pairs of :class:`PackedQuantConfig` fields (``desc_act`` read as ``act_order``).
    """

    pattern: str
    skip: bool
    overrides: tuple[tuple[str, Any], ...] = ()

    def matches(self, prefix: str) -> bool:
        return re.match(self.pattern, prefix) is not None


@attrs.frozen
class GPTQConfig(PackedQuantConfig):
    """A GPTQ checkpoint (AutoGPTQ, GPTQModel): ``checkpoint_format`` ``gptq`` stores zero points minus one.

    :ivar dynamic: GPTQModel's per-module rules, first match wins (e.g. its
        ``lm_head=True`` writes the head as 8-bit, group 32, symmetric).
    """

    name: ClassVar[str] = METHOD_NAME

    checkpoint_format: str = "gptq"
    dynamic: tuple[DynamicRule, ...] = ()

    def _rule(self, prefix: str) -> DynamicRule | None:
        return next((rule for rule in self.dynamic if rule.matches(prefix)), None)

    def ignores(self, prefix: str) -> bool:
        rule = self._rule(prefix)
        return super().ignores(prefix) or (rule is not None and rule.skip)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """The shared method, with this layer's ``dynamic`` overrides (a fused layer's parts must agree)."""
        method = super().get_quant_method(layer, prefix)
        if not isinstance(method, PackedLinearMethod) or not self.dynamic:
            return method
        parent, _, leaf = prefix.rpartition(".")
        names = [f"{parent}.{part}" if parent else part for part in self.packed_modules.get(leaf, ())] or [prefix]
        config = self.for_modules(names, prefix)
        return method if config is self else PackedLinearMethod(config)

    def for_modules(self, names: Sequence[str], prefix: str) -> PackedQuantConfig:
        """This config with the ``dynamic`` overrides of ``names``, which must agree (one fused weight)."""
        if not self.dynamic:
            return self
        found = {name: rule.overrides if (rule := self._rule(name)) is not None else () for name in names}
        if len(set(found.values())) > 1:
            first_with: dict[tuple[tuple[str, Any], ...], str] = {}
            for name, settings in found.items():
                first_with.setdefault(settings, name)
            shown = {name: dict(settings) for settings, name in first_with.items()}
            raise UnsupportedError(f"{_WHERE}: dynamic gives the parts of {prefix} different settings {shown}; "
                                   "they share one fused weight")
        overrides = dict(next(iter(found.values())))
        return attrs.evolve(self, **overrides) if overrides else self  # kernel_log is the same dict

    @property
    def zeros_stored_minus_one(self) -> bool:
        """Whether ``qzeros`` hold zero - 1 (the v1 ``gptq`` convention)."""
        return self.checkpoint_format == "gptq"

    @property
    def layout(self) -> CheckpointLayout:
        return GPTQLayout(self)

    def describe(self) -> dict[str, Any]:
        dynamic = {("-:" if rule.skip else "+:") + rule.pattern: dict(rule.overrides) for rule in self.dynamic}
        return {**super().describe(), "checkpoint_format": self.checkpoint_format, "dynamic": dynamic}


def check_flag(declared: Mapping[str, Any], key: str, default: bool, where: str) -> bool:
    value = declared.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key} must be true or false, found {value!r}")
    return value


def kernel_option(options: Mapping[str, Any] | None, method: str, kernels: Sequence[str] = KERNELS,
                  scope: str = "") -> str:
    """``quantization_options["kernel"]`` checked (the only option these formats take): one of ``kernels``
    (the packed formats' by default); ``scope`` ends the message naming the layers it is for (`` for FP4``)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"quantization_options: unknown {method} option(s) {unknown}; expected some of "
                          f"{list(OPTIONS)}")
    kernel = options.get("kernel", "auto")
    if kernel not in kernels:
        raise ConfigError(f"quantization_options: kernel {kernel!r} is not one of {list(kernels)}{scope}")
    return str(kernel)


def exact_float32_option(options: Mapping[str, Any] | None) -> bool:
    """``quantization_options["exact_float32"]`` checked: ``True`` keeps a float32 load's packed layers on paths
    that compute in float32 (default ``False``: float32 activations may be cast to bfloat16 for the packed
    kernel, see :mod:`~loader_plugin_marlin.kernel_paths`); not given: ``LOADER_KERNEL_EXACT_FLOAT32``."""
    value = dict(options or {}).get("exact_float32", exact_float32_default())
    if not isinstance(value, bool):
        raise ConfigError(f"quantization_options: exact_float32 must be true or false, found {value!r}")
    return value


def module_list(value: Any, key: str, where: str) -> tuple[str, ...]:
    """A list of module names from the config (``None``: empty)."""
    value = value or ()
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {key} must be a list of module names, found {value!r}")
    return tuple(value)


_WHERE = "config.json quantization_config"


def _bits(value: Any, where: str) -> int:
    if isinstance(value, bool) or value not in BITS:
        raise UnsupportedError(f"{where}: bits {value!r} is not supported; GPTQ checkpoints load with bits 4 or 8")
    return int(value)


def _group_size(value: Any, where: str) -> int:
    if isinstance(value, bool) or value not in GROUP_SIZES:
        raise UnsupportedError(f"{where}: group_size {value!r} is not one of {list(GROUP_SIZES)}")
    return int(value)


def _dynamic(value: Any) -> tuple[DynamicRule, ...]:
    """GPTQModel's ``dynamic``: ``{pattern: {field: value}}``; fields other than bits, group_size, sym and desc_act
    (its quantizer's own settings, e.g. ``mse``) do not change what is stored and are not kept."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(f"{_WHERE}: dynamic must map module patterns to settings, found {value!r}")
    rules = []
    for key, settings in value.items():
        where = f"{_WHERE}.dynamic[{key!r}]"
        if not isinstance(key, str) or not isinstance(settings, Mapping):
            raise ConfigError(f"{where}: expected a module pattern mapped to a dict of settings, found {settings!r}")
        skip = key.startswith("-:")
        pattern = key[2:] if key.startswith(("-:", "+:")) else key
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"{where}: {pattern!r} is not a regular expression: {exc}") from exc
        checks = {"bits": _bits, "group_size": _group_size}
        overrides = []
        for field, attribute in _DYNAMIC_FIELDS.items():
            if field in settings:
                check = checks.get(field)
                found = check(settings[field], where) if check else check_flag(settings, field, False, where)
                overrides.append((attribute, found))
        rules.append(DynamicRule(pattern, skip, tuple(overrides)))
    return tuple(rules)


def config_from_checkpoint(declared: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> GPTQConfig:
    """The config of a checkpoint whose ``quantization_config`` names GPTQ; every bad field is an error."""
    bits = _bits(declared.get("bits"), _WHERE)
    group_size = _group_size(declared.get("group_size", -1), _WHERE)
    checkpoint_format = declared.get("checkpoint_format") or declared.get("format") or "gptq"
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise UnsupportedError(
            f"{_WHERE}: checkpoint_format {checkpoint_format!r} is not supported; expected one of "
            f"{list(CHECKPOINT_FORMATS)}"
        )
    return GPTQConfig(
        bits=int(bits), group_size=int(group_size), act_order=check_flag(declared, "desc_act", False, _WHERE),
        sym=check_flag(declared, "sym", True, _WHERE), checkpoint_format=str(checkpoint_format),
        kernel=kernel_option(options, METHOD_NAME),
        skip_modules=module_list(declared.get("modules_to_not_convert"), "modules_to_not_convert", _WHERE),
        lm_head=check_flag(declared, "lm_head", False, _WHERE), dynamic=_dynamic(declared.get("dynamic")),
    )
