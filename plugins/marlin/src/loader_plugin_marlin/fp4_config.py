"""The quantization configs of FP4 checkpoints (NVFP4, MXFP4), read with every bad field named.

* compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized`` groups
  (llm-compressor's NVFP4A16 / MXFP4A16): :func:`fp4_scheme_from_ct`, called by
  the compressed-tensors dispatcher for each such group. A group that also
  quantizes activations (the ``NVFP4`` preset: ``input_activations`` with an
  ``input_global_scale`` per layer) rounds each input to FP4 as
  compressed-tensors' reference does (:mod:`.fp4_activations`); other
  activation schemes are refused by name.
* NVIDIA ModelOpt NVFP4: :class:`~.modelopt_config.ModelOptFp4Config`, read by
  :mod:`.modelopt_config`.

Each config hands :class:`~.fp4_method.Fp4LinearMethod` to the parallel linear
layers and records each layer's :class:`~loader.kernels.KernelChoice`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import FusedMoE, LinearBase, ParallelLMHead, QuantizationConfig

from .config import kernel_option
from .fp4_format import FP4_SCHEMES, NVFP4_W4A4, Fp4Scheme
from .fp4_method import Fp4LinearMethod

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import QuantizeMethodBase

__all__ = ["KERNELS", "CompressedTensorsFp4Config", "Fp4Config", "fp4_kernel_option", "fp4_scheme_from_ct"]

_WHERE = "config.json quantization_config"
KERNELS = ("auto", "dequantize")
"""``quantization_options["kernel"]``: both decode the weight at load (there is no FP4 matmul here)."""


@attrs.frozen
class Fp4Config(QuantizationConfig):
    """An FP4 checkpoint: its :class:`~.fp4_format.Fp4Scheme`, the kernel asked for, the modules kept dense.

    :ivar activations_quantized: the producer quantized activations to FP4 too (applied where the scheme says:
        :attr:`~.fp4_format.Fp4Scheme.input_applied`).
    :ivar kernel_log: each FP4 layer's kernel, filled after loading.
    """

    name: ClassVar[str] = "fp4"

    scheme: Fp4Scheme
    kernel: str = "auto"
    skip_modules: tuple[str, ...] = ()
    activations_quantized: bool = False
    kernel_log: dict[str, KernelChoice] = attrs.field(factory=dict, eq=False, repr=False)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~.fp4_method.Fp4LinearMethod` for every parallel linear layer; FP4 experts and an FP4
        output head are refused by name."""
        if isinstance(layer, FusedMoE):
            raise UnsupportedError(f"{prefix}: {self.scheme.kind.upper()} mixture-of-experts layers are not "
                                   "supported yet")
        if isinstance(layer, ParallelLMHead):
            raise UnsupportedError(f"{prefix}: an {self.scheme.kind.upper()} output head is not supported; keep "
                                   "lm_head unquantized")
        return Fp4LinearMethod(self) if isinstance(layer, LinearBase) else None

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for choice in self.kernel_log.values():
            counts[choice.kernel] = counts.get(choice.kernel, 0) + 1
        scheme = self.scheme
        return {"method": self.name, "weights": scheme.kind, "group_size": scheme.group_size,
                "scale_dtype": scheme.scale_type, "activations_quantized": self.activations_quantized,
                "activations_applied": scheme.input_applied, "kernel": self.kernel,
                "skip_modules": list(self.skip_modules), "kernels": counts,
                "layers": {prefix: choice.record() for prefix, choice in sorted(self.kernel_log.items())}}


@attrs.frozen
class CompressedTensorsFp4Config(Fp4Config):
    """One compressed-tensors FP4 group; the dispatcher decides which layers it covers."""

    name: ClassVar[str] = "compressed-tensors"


def fp4_kernel_option(options: Mapping[str, Any] | None, method: str) -> str:
    """``quantization_options["kernel"]`` checked: one of the FP4 kernels."""
    return kernel_option(options, method, KERNELS, f" for FP4 ({method})")


def _check_weights(weights: Any, layout: Fp4Scheme, fmt: str, where: str) -> None:
    """A compressed-tensors ``weights`` entry that must describe ``layout``: 4-bit symmetric float, its group
    size and scale dtype, static."""
    if not isinstance(weights, Mapping):
        raise ConfigError(f"{where} must be an object, found {weights!r}")
    if weights.get("num_bits") != 4 or weights.get("type") != "float":
        raise UnsupportedError(f"{where}: num_bits {weights.get('num_bits')!r} type {weights.get('type')!r} is "
                               f"not FP4; {fmt} loads num_bits 4, type 'float'")
    strategy = "tensor_group" if layout.kind == "nvfp4" else "group"
    if weights.get("strategy") != strategy:
        raise UnsupportedError(f"{where}: strategy {weights.get('strategy')!r} is not supported; {fmt} stores "
                               f"strategy {strategy!r}")
    if weights.get("group_size") != layout.group_size:
        raise UnsupportedError(f"{where}: group_size {weights.get('group_size')!r} is not supported; {fmt} "
                               f"({layout.kind.upper()}) has groups of {layout.group_size}")
    expected_scale = f"torch.{str(layout.scale_dtype).removeprefix('torch.')}"
    if weights.get("scale_dtype") not in (None, expected_scale, expected_scale.removeprefix("torch.")):
        raise UnsupportedError(f"{where}: scale_dtype {weights.get('scale_dtype')!r} is not supported; {fmt} "
                               f"stores {expected_scale} scales")
    for key, allowed in (("symmetric", (True, None)), ("dynamic", (False, None)), ("actorder", (None,))):
        if weights.get(key) not in allowed:
            raise UnsupportedError(f"{where}: {key} {weights.get(key)!r} is not supported for {fmt}")


def fp4_scheme_from_ct(name: str, scheme: Mapping[str, Any],
                       options: Mapping[str, Any] | None = None) -> CompressedTensorsFp4Config:
    """The config of one compressed-tensors FP4 group ``config_groups.<name>`` (its ``format`` says NVFP4 or
    MXFP4, falling back to the checkpoint's when the group has none).

    :param scheme: the group's entry; its ``targets`` and the config's ``ignore`` are the caller's to apply.
    :param options: ``quantization_options`` (``kernel``).
    """
    where = f"{_WHERE} config_groups.{name}"
    fmt = scheme.get("format") or ("mxfp4-pack-quantized" if _declared_group(scheme) == 32 else
                                   "nvfp4-pack-quantized")
    layout = FP4_SCHEMES.get(str(fmt))
    if layout is None:
        raise UnsupportedError(f"{where}: format {fmt!r} is not an FP4 format; expected one of {list(FP4_SCHEMES)}")
    _check_weights(scheme.get("weights"), layout, str(fmt), f"{where}.weights")
    if scheme.get("output_activations") is not None:
        raise UnsupportedError(f"{where}: output_activations are not supported")
    activations = scheme.get("input_activations")
    if activations is not None:
        _check_activations(activations, layout, f"{where}.input_activations")
        layout = NVFP4_W4A4
    return CompressedTensorsFp4Config(scheme=layout, kernel=fp4_kernel_option(options, "compressed-tensors"),
                                      activations_quantized=activations is not None)


def _check_activations(args: Any, layout: Fp4Scheme, where: str) -> None:
    """The ``NVFP4`` preset's ``input_activations``: FP4 in groups of 16, a static global scale and dynamic
    (``local``) group scales — the one activation scheme whose rounding :mod:`.fp4_activations` reproduces."""
    expected = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "dynamic": "local",
                "symmetric": True}
    if not isinstance(args, Mapping):
        raise ConfigError(f"{where} must be an object or null, found {args!r}")
    found = {key: args.get(key, True if key == "symmetric" else None) for key in expected}
    if layout.kind != "nvfp4" or found != expected:
        raise UnsupportedError(
            f"{where}: {found} with {layout.kind.upper()} weights is not supported; FP4 activations load as the "
            f"NVFP4 preset writes them: {expected}")


def _declared_group(scheme: Mapping[str, Any]) -> object:
    weights = scheme.get("weights")
    return weights.get("group_size") if isinstance(weights, Mapping) else None
