"""``GPTQConfig``: a GPTQ checkpoint's quantization settings, read from ``config.json``.

GPTQ (AutoGPTQ, GPTQModel) writes ``quantization_config`` with ``quant_method:
"gptq"``, ``bits``, ``group_size`` (-1: one group over the whole input),
``desc_act`` (act-order: input rows quantized in a permuted order, recorded
in ``g_idx``), ``sym`` and ``checkpoint_format`` (``gptq`` stores zero points
minus one, ``gptq_v2`` stores them as they are). Everything here is checked
once, before any layer is built, and each bad field is named.

The config also keeps the per-layer kernel choices made after loading
(:attr:`GPTQConfig.kernel_log`) so ``loader load --json`` shows them.

Importing this module is light (no torch): the entry point imports it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers.quantization import QuantizationConfig

if TYPE_CHECKING:
    from torch import nn

    from loader.layers.quantization import QuantizeMethodBase

__all__ = ["BITS", "CHECKPOINT_FORMATS", "KERNELS", "METHOD_NAME", "GPTQConfig", "KernelChoice",
           "config_from_checkpoint"]

METHOD_NAME = "gptq"
BITS = (4, 8)
GROUP_SIZES = (-1, 16, 32, 64, 128, 256, 512, 1024)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
KERNELS = ("auto", "marlin", "int4pack", "int8pack", "dequantize")
"""``auto`` picks per layer (Marlin on CUDA, the packed kernels on CPU); the others force one kernel (layers it
cannot take fall back to ``dequantize``, with the reason)."""


@attrs.frozen
class KernelChoice:
    """The kernel one layer runs with, and why when it is not the preferred one."""

    kernel: str
    reason: str | None = None


def _matches(prefix: str, module: str) -> bool:
    """Whether dotted ``module`` names ``prefix`` or one of its parents, by whole components."""
    return f".{module}." in f".{prefix}."


@attrs.frozen
class GPTQConfig(QuantizationConfig):
    """Settings of a GPTQ checkpoint.

    :ivar bits: 4 or 8 bits per weight.
    :ivar group_size: input rows sharing one scale and zero point; -1 for one group over all of them.
    :ivar desc_act: act-order: ``g_idx`` maps each input row to its group in an arbitrary order.
    :ivar sym: symmetric quantization (zero point ``2**(bits-1)``).
    :ivar checkpoint_format: ``gptq`` (zero points stored minus one) or ``gptq_v2``.
    :ivar kernel: ``quantization_options["kernel"]``, see :data:`KERNELS`.
    :ivar skip_modules: modules the checkpoint keeps in floating point (``modules_to_not_convert``).
    :ivar kernel_log: each quantized layer's :class:`KernelChoice`, filled after loading.
    """

    name: ClassVar[str] = METHOD_NAME

    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    checkpoint_format: str = "gptq"
    kernel: str = "auto"
    skip_modules: tuple[str, ...] = ()
    kernel_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False, repr=False)

    @property
    def pack_factor(self) -> int:
        """Codes per stored int32."""
        return 32 // self.bits

    @property
    def zeros_stored_minus_one(self) -> bool:
        """Whether ``qzeros`` hold zero - 1 (the v1 ``gptq`` convention)."""
        return self.checkpoint_format == "gptq"

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for choice in self.kernel_log.values():
            counts[choice.kernel] = counts.get(choice.kernel, 0) + 1
        return {
            "method": self.name,
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "checkpoint_format": self.checkpoint_format,
            "kernel": self.kernel,
            "kernels": counts,
            "layers": {prefix: attrs.asdict(choice) for prefix, choice in sorted(self.kernel_log.items())},
        }

    def ignores(self, prefix: str) -> bool:
        return any(_matches(prefix, m) for m in self.skip_modules)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~loader_plugin_marlin.linear_method.GPTQLinearMethod` for every parallel linear layer."""
        from loader.layers.linear import LinearBase

        if not isinstance(layer, LinearBase):
            return None
        from .linear_method import GPTQLinearMethod

        return GPTQLinearMethod(self)


_WHERE = "config.json quantization_config"


def _flag(declared: Mapping[str, Any], key: str, default: bool) -> bool:
    value = declared.get(key, default)
    if not isinstance(value, bool):
        raise ConfigError(f"{_WHERE}: {key} must be true or false, found {value!r}")
    return value


def _kernel(options: Mapping[str, Any] | None) -> str:
    options = dict(options or {})
    unknown = sorted(set(options) - {"kernel"})
    if unknown:
        raise ConfigError(f"quantization_options: unknown gptq option(s) {unknown}; expected some of ['kernel']")
    kernel = options.get("kernel", "auto")
    if kernel not in KERNELS:
        raise ConfigError(f"quantization_options: kernel {kernel!r} is not one of {list(KERNELS)}")
    return str(kernel)


def _skip_modules(declared: Mapping[str, Any]) -> tuple[str, ...]:
    value = declared.get("modules_to_not_convert") or ()
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{_WHERE}: modules_to_not_convert must be a list of module names, found {value!r}")
    return tuple(value)


def config_from_checkpoint(declared: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> GPTQConfig:
    """The config of a checkpoint whose ``quantization_config`` names GPTQ; every bad field is an error."""
    bits = declared.get("bits")
    if isinstance(bits, bool) or bits not in BITS:
        raise UnsupportedError(f"{_WHERE}: bits {bits!r} is not supported; GPTQ checkpoints load with bits 4 or 8")
    group_size = declared.get("group_size", -1)
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise UnsupportedError(f"{_WHERE}: group_size {group_size!r} is not one of {list(GROUP_SIZES)}")
    checkpoint_format = declared.get("checkpoint_format") or declared.get("format") or "gptq"
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise UnsupportedError(
            f"{_WHERE}: checkpoint_format {checkpoint_format!r} is not supported; expected one of "
            f"{list(CHECKPOINT_FORMATS)}"
        )
    if _flag(declared, "lm_head", False):
        raise UnsupportedError(f"{_WHERE}: a quantized lm_head (lm_head: true) is not supported")
    return GPTQConfig(
        bits=int(bits), group_size=int(group_size), desc_act=_flag(declared, "desc_act", False),
        sym=_flag(declared, "sym", True), checkpoint_format=str(checkpoint_format), kernel=_kernel(options),
        skip_modules=_skip_modules(declared),
    )
