"""The quantization configs of FP8 checkpoints, read from ``config.json`` with every bad field named.

* ``quant_method: "fp8"`` — transformers' FineGrainedFP8 (DeepSeek-V3, Qwen3-FP8):
  ``weight_block_size`` (default ``[128, 128]``; ``null``: one scale per tensor),
  ``activation_scheme: "dynamic"``, ``fmt: "e4m3"``, ``modules_to_not_convert``.
  Activations stay in full precision on the CPU, as transformers computes there
  (it dequantizes these checkpoints when no GPU is present).
* ``quant_method: "fbgemm_fp8"`` — per-row scales, dynamic per-row activations
  whose maximum is clamped to ``activation_scale_ub``; ``modules_to_not_convert``.
* a compressed-tensors ``float-quantized`` group (:func:`fp8_scheme_from_ct`),
  called by the compressed-tensors dispatcher for each such group.

Each config hands :class:`~.fp8_method.Fp8LinearMethod` to the parallel linear
layers and records each layer's :class:`~loader.kernels.KernelChoice`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import FusedMoE, LinearBase, QuantizationConfig

from .config import kernel_option, module_list
from .fp8_kernels import KERNELS
from .fp8_method import Fp8LinearMethod
from .fp8_scheme import WEIGHT_STRATEGIES, ActivationQuant, Fp8Scheme

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import QuantizeMethodBase

__all__ = ["CompressedTensorsFp8Config", "FbgemmFp8Config", "Fp8Config", "fbgemm_fp8_config_from_checkpoint",
           "fp8_config_from_checkpoint", "fp8_scheme_from_ct"]

_WHERE = "config.json quantization_config"
DEFAULT_BLOCK = (128, 128)
"""transformers' ``weight_block_size`` when the key is absent."""
FBGEMM_SCALE_UB = 1200.0
"""transformers' ``activation_scale_ub`` when the key is absent."""


@attrs.frozen
class Fp8Config(QuantizationConfig):
    """An FP8 checkpoint: its :class:`~.fp8_scheme.Fp8Scheme`, the kernel asked for, the modules kept dense.

    :ivar kernel: ``quantization_options["kernel"]``, one of :data:`~.fp8_kernels.KERNELS`.
    :ivar kernel_log: each FP8 layer's kernel, filled after loading.
    """

    name: ClassVar[str] = "fp8"

    scheme: Fp8Scheme
    kernel: str = "auto"
    skip_modules: tuple[str, ...] = ()
    kernel_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False, repr=False)

    def ignores(self, prefix: str) -> bool:
        return any(f".{module}." in f".{prefix}." for module in self.skip_modules)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~.fp8_method.Fp8LinearMethod` for every parallel linear layer; FP8 experts are refused."""
        if isinstance(layer, FusedMoE):
            raise UnsupportedError(f"{prefix}: FP8 ({self.name}) mixture-of-experts layers are not supported yet")
        return Fp8LinearMethod(self) if isinstance(layer, LinearBase) else None

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for choice in self.kernel_log.values():
            counts[choice.kernel] = counts.get(choice.kernel, 0) + 1
        return {"method": self.name, **self.scheme.describe(), "kernel": self.kernel,
                "skip_modules": list(self.skip_modules), "kernels": counts,
                "layers": {prefix: choice.record() for prefix, choice in sorted(self.kernel_log.items())}}


@attrs.frozen
class FbgemmFp8Config(Fp8Config):
    """A ``fbgemm_fp8`` checkpoint (per-row weight scales, dynamic per-row activations)."""

    name: ClassVar[str] = "fbgemm_fp8"


@attrs.frozen
class CompressedTensorsFp8Config(Fp8Config):
    """One compressed-tensors ``float-quantized`` group; the dispatcher decides which layers it covers."""

    name: ClassVar[str] = "compressed-tensors"


def fp8_kernel_option(options: Mapping[str, Any] | None, method: str) -> str:
    """``quantization_options["kernel"]`` checked: one of the FP8 kernels."""
    return kernel_option(options, method, KERNELS, f" for {method}")


def _block(value: Any, where: str, key: str) -> tuple[int, int]:
    if (isinstance(value, str) or not isinstance(value, (list, tuple)) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)):
        raise ConfigError(f"{where}: {key} must be two positive integers [rows, columns], found {value!r}")
    return int(value[0]), int(value[1])


def fp8_config_from_checkpoint(declared: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> Fp8Config:
    """The config of a ``quant_method: "fp8"`` checkpoint (transformers' FineGrainedFP8Config fields)."""
    fmt = declared.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise UnsupportedError(f"{_WHERE}: fmt {fmt!r} is not supported; FP8 checkpoints load as 'e4m3' "
                               "(float8_e4m3fn)")
    activation_scheme = declared.get("activation_scheme", "dynamic")
    if activation_scheme != "dynamic":
        raise UnsupportedError(f"{_WHERE}: activation_scheme {activation_scheme!r} is not supported; expected "
                               "'dynamic'")
    scale_fmt = declared.get("scale_fmt")
    if scale_fmt not in (None, "float"):
        raise UnsupportedError(f"{_WHERE}: scale_fmt {scale_fmt!r} is not supported; expected 'float' "
                               "(float32 weight_scale_inv)")
    raw_block = declared.get("weight_block_size", list(DEFAULT_BLOCK))
    block = None if raw_block is None else _block(raw_block, _WHERE, "weight_block_size")
    acts = ActivationQuant("token" if block is None else "group", dynamic=True,
                           group_size=None if block is None else block[1], emulated_on_cpu=False)
    scheme = Fp8Scheme("tensor" if block is None else "block", scale_name="weight_scale_inv", block=block,
                       activations=acts)
    return Fp8Config(scheme=scheme, kernel=fp8_kernel_option(options, "fp8"),
                     skip_modules=module_list(declared.get("modules_to_not_convert"), "modules_to_not_convert",
                                              _WHERE))


def fbgemm_fp8_config_from_checkpoint(declared: Mapping[str, Any],
                                      options: Mapping[str, Any] | None = None) -> FbgemmFp8Config:
    """The config of a ``quant_method: "fbgemm_fp8"`` checkpoint."""
    bound = declared.get("activation_scale_ub", FBGEMM_SCALE_UB)
    if isinstance(bound, bool) or not isinstance(bound, (int, float)) or bound <= 0:
        raise ConfigError(f"{_WHERE}: activation_scale_ub must be a positive number, found {bound!r}")
    acts = ActivationQuant("token", dynamic=True, scale_ub=float(bound))
    return FbgemmFp8Config(scheme=Fp8Scheme("channel", activations=acts),
                           kernel=fp8_kernel_option(options, "fbgemm_fp8"),
                           skip_modules=module_list(declared.get("modules_to_not_convert"),
                                                    "modules_to_not_convert", _WHERE))


def _float8_args(args: Any, where: str) -> Mapping[str, Any]:
    """A compressed-tensors ``QuantizationArgs`` dict that must say 8-bit symmetric float."""
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where} must be an object, found {args!r}")
    if args.get("type") != "float" or args.get("num_bits") != 8:
        raise UnsupportedError(f"{where}: num_bits {args.get('num_bits')!r} type {args.get('type')!r} is not "
                               "FP8; float-quantized loads num_bits 8, type 'float'")
    if args.get("symmetric", True) is not True:
        raise UnsupportedError(f"{where}: symmetric {args.get('symmetric')!r} is not supported; FP8 is symmetric")
    return args


def _ct_activations(args: Any, where: str) -> ActivationQuant | None:
    if args is None:
        return None
    args = _float8_args(args, where)
    strategy, dynamic = args.get("strategy"), args.get("dynamic")
    if strategy == "token" and dynamic is True:
        return ActivationQuant("token", dynamic=True)
    if strategy == "tensor" and dynamic in (True, False):
        return ActivationQuant("tensor", dynamic=bool(dynamic))
    if strategy == "group" and dynamic is True:
        size = args.get("group_size")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ConfigError(f"{where}: strategy 'group' needs a positive group_size, found {size!r}")
        return ActivationQuant("group", dynamic=True, group_size=size)
    raise UnsupportedError(f"{where}: strategy {strategy!r} with dynamic {dynamic!r} is not supported; expected "
                           "'token' (dynamic), 'tensor' (static or dynamic) or 'group' (dynamic)")


def fp8_scheme_from_ct(name: str, scheme: Mapping[str, Any],
                       options: Mapping[str, Any] | None = None) -> CompressedTensorsFp8Config:
    """The config of one compressed-tensors ``float-quantized`` group ``config_groups.<name>``.

    :param scheme: the group's entry (``weights``, ``input_activations``, ``output_activations``, ...); its
        ``targets`` and the config's ``ignore`` are the caller's to apply.
    :param options: ``quantization_options`` (``kernel``).
    """
    where = f"{_WHERE} config_groups.{name}"
    weights = _float8_args(scheme.get("weights"), f"{where}.weights")
    strategy = weights.get("strategy")
    if strategy not in WEIGHT_STRATEGIES:
        raise UnsupportedError(f"{where}.weights: strategy {strategy!r} is not supported; expected one of "
                               f"{list(WEIGHT_STRATEGIES)}")
    if weights.get("dynamic", False) is not False:
        raise UnsupportedError(f"{where}.weights: dynamic {weights.get('dynamic')!r} is not supported; FP8 "
                               "weights are stored with their scales")
    block = _block(weights.get("block_structure"), f"{where}.weights", "block_structure") \
        if strategy == "block" else None
    if scheme.get("output_activations") is not None:
        raise UnsupportedError(f"{where}: output_activations are not supported")
    acts = _ct_activations(scheme.get("input_activations"), f"{where}.input_activations")
    return CompressedTensorsFp8Config(
        scheme=Fp8Scheme(str(strategy), block=block, activations=acts),
        kernel=fp8_kernel_option(options, "compressed-tensors"))
