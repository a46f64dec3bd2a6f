"""compressed-tensors ``int-quantized`` / ``naive-quantized`` groups: int8 weights, optionally int8 activations.

llm-compressor's ``W8A8`` preset writes (compressed-tensors 0.20, one ``config_groups`` entry)::

    "weights":           {"num_bits": 8, "type": "int", "symmetric": true, "group_size": null,
                          "strategy": "channel", "dynamic": false}
    "input_activations": {"num_bits": 8, "type": "int", "symmetric": true, "group_size": null,
                          "strategy": "token", "dynamic": true}

with format ``int-quantized`` (``naive-quantized`` stores the same tensors: both are compressed-tensors'
``NaiveQuantizationCompressor``, which writes the codes in the scheme's own dtype, int8 for 8-bit ints).
Weights may also be ``tensor`` or ``group`` (``group_size``) and asymmetric; activations ``tensor`` and static
(``dynamic: false``: a stored ``input_scale``, plus ``input_zero_point`` when asymmetric) or ``token`` and
dynamic. Per linear layer (``nn.Linear`` orientation, ``N`` out, ``K`` in): ``weight`` int8 ``[N, K]``,
``weight_scale`` ``[N, 1]`` / ``[1]`` / ``[N, K / group]``, ``weight_zero_point`` (int8, same shape) when
asymmetric, and ``input_scale`` / ``input_zero_point`` ``[1]`` for static activations. The weight is
``(weight - weight_zero_point) * weight_scale``.

:func:`int8_scheme_from_ct` reads one group into an :class:`Int8Config`; the compressed-tensors dispatcher
decides which layers belong to the group and asks the config for their method.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import LinearBase, QuantizationConfig

from .config import kernel_option
from .int8_method import Int8LinearMethod
from .int8_scheme import Int8Activations, Int8Scheme

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import QuantizeMethodBase

__all__ = ["INT8_KERNELS", "Int8Config", "int8_scheme_from_ct"]

INT8_KERNELS = ("auto", "int8pack", "int8_mm", "dequantized", "dequantize")
"""``auto`` chooses per layer and device (:mod:`~loader_plugin_marlin.int8_kernels`); ``int8pack`` torch's
weight-only int8 kernel (activations kept in floating point), ``int8_mm`` int8 activations times int8 weights
(``torch._int_mm``, the checkpoint's activation quantization applied, vLLM's math), ``dequantized`` the weight
dequantized once at load, ``dequantize`` dequantized on every call (the reference)."""

WEIGHT_STRATEGIES = ("channel", "tensor", "group")
ACTIVATION_STRATEGIES = {True: ("token",), False: ("tensor",)}
_WHERE = "config.json quantization_config config_groups"


@attrs.frozen
class Int8Config(QuantizationConfig):
    """The int8 layers of one compressed-tensors group, the kernel asked for, and the kernels chosen.

    :ivar kernel_log: each layer's :class:`~loader.kernels.KernelChoice`, filled after loading.
    """

    name: ClassVar[str] = "compressed-tensors"

    scheme: Int8Scheme
    kernel: str = "auto"
    kernel_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False, repr=False)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~loader_plugin_marlin.int8_method.Int8LinearMethod` for every parallel linear layer."""
        return Int8LinearMethod(self) if isinstance(layer, LinearBase) else None

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for choice in self.kernel_log.values():
            counts[choice.kernel] = counts.get(choice.kernel, 0) + 1
        return {"method": self.name, "format": "int-quantized", "bits": 8, **self.scheme.describe(),
                "kernel": self.kernel, "kernels": counts,
                "layers": {prefix: choice.record() for prefix, choice in sorted(self.kernel_log.items())}}


def _args(scheme: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any] | None:
    """``weights`` / ``input_activations`` of a scheme: 8-bit ints or nothing; every bad field named."""
    args = scheme.get(key)
    if args is None:
        return None
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where}.{key} must be an object or null, found {args!r}")
    bits, kind = args.get("num_bits"), args.get("type", "int")
    if isinstance(bits, bool) or bits != 8 or kind != "int":
        raise UnsupportedError(f"{where}.{key}: num_bits {bits!r} type {kind!r} is not supported; "
                               "int-quantized loads 8-bit ints")
    if not isinstance(args.get("symmetric", True), bool):
        raise ConfigError(f"{where}.{key}.symmetric must be true or false, found {args.get('symmetric')!r}")
    return args


def _weights(args: Mapping[str, Any] | None, where: str) -> tuple[str, int, bool]:
    if args is None:
        raise ConfigError(f"{where}.weights is missing; an int-quantized group quantizes weights")
    strategy = args.get("strategy")
    if strategy not in WEIGHT_STRATEGIES:
        raise UnsupportedError(f"{where}.weights: strategy {strategy!r} is not supported; expected one of "
                               f"{list(WEIGHT_STRATEGIES)}")
    group_size = args.get("group_size")
    if strategy == "group" and (isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0):
        raise ConfigError(f"{where}.weights: strategy 'group' needs a positive group_size, found {group_size!r}")
    if args.get("dynamic") not in (None, False):
        raise UnsupportedError(f"{where}.weights: dynamic weight quantization is not supported")
    if args.get("actorder") not in (None, "weight", "static"):
        raise UnsupportedError(f"{where}.weights: actorder {args.get('actorder')!r} is not supported for "
                               "int-quantized (no weight_g_idx is read)")
    size = group_size if strategy == "group" and isinstance(group_size, int) else -1
    return str(strategy), size, bool(args.get("symmetric", True))


def _activations(args: Mapping[str, Any] | None, where: str) -> Int8Activations | None:
    if args is None:
        return None
    dynamic = args.get("dynamic", False)
    if dynamic not in (True, False):
        raise UnsupportedError(f"{where}.input_activations: dynamic {dynamic!r} is not supported; expected "
                               "true (a scale per token) or false (a stored input_scale)")
    strategy = args.get("strategy")
    if strategy not in ACTIVATION_STRATEGIES[dynamic]:
        kind = "dynamic" if dynamic else "static"
        raise UnsupportedError(f"{where}.input_activations: strategy {strategy!r} is not supported for {kind} "
                               f"activations; expected one of {list(ACTIVATION_STRATEGIES[dynamic])}")
    return Int8Activations(dynamic=bool(dynamic), symmetric=bool(args.get("symmetric", True)))


def _kernel(options: Mapping[str, Any] | None) -> str:
    return kernel_option(options, "int8", INT8_KERNELS, " for int-quantized layers")


def int8_scheme_from_ct(name: str, scheme: Mapping[str, Any], options: Mapping[str, Any] | None) -> Int8Config:
    """The config of the ``config_groups`` entry ``name`` (format ``int-quantized`` or ``naive-quantized``).

    :param scheme: the entry (``targets``, ``weights``, ``input_activations``; its targets are the caller's).
    :param options: ``quantization_options`` (``kernel``: one of :data:`INT8_KERNELS`).
    :raises ConfigError: a malformed field. :raises UnsupportedError: a well-formed scheme this method cannot load.
    """
    where = f"{_WHERE}.{name}"
    if scheme.get("output_activations") is not None:
        raise UnsupportedError(f"{where}.output_activations: output quantization is not supported")
    strategy, group_size, symmetric = _weights(_args(scheme, "weights", where), where)
    activations = _activations(_args(scheme, "input_activations", where), where)
    return Int8Config(Int8Scheme(strategy, group_size, symmetric, activations), kernel=_kernel(options))
