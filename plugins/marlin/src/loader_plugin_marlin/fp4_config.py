"""The quantization configs of FP4 checkpoints (NVFP4, MXFP4), read with every bad field named.

* compressed-tensors ``nvfp4-pack-quantized`` / ``mxfp4-pack-quantized`` groups
  (llm-compressor's NVFP4A16 / MXFP4A16): :func:`fp4_scheme_from_ct`, called by
  the compressed-tensors dispatcher for each such group. A group that also
  quantizes activations (the ``NVFP4`` preset: ``input_activations`` with an
  ``input_global_scale`` per layer) rounds each input to FP4 as
  compressed-tensors' reference does (:mod:`.fp4_activations`); other
  activation schemes are refused by name.
* NVIDIA ModelOpt (``quant_method: "modelopt"`` in ``config.json``'s
  ``quantization_config``, flat — ``quant_algo``, ``group_size``, ``ignore`` — or
  nested as in ``hf_quant_config.json`` — ``quantization: {quant_algo,
  exclude_modules, ...}``): :func:`modelopt_config_from_checkpoint`. A checkpoint
  whose config is only in ``hf_quant_config.json`` is not seen by the
  quantization hook (it receives ``config.json``). ``NVFP4`` checkpoints store an
  ``input_scale`` for FP4 activations; it is read and checked but not applied:
  the weights are decoded and the activations kept in the model's dtype, as
  vLLM's Marlin FP4 path runs them on GPUs before compute capability 10.0.
  ModelOpt ``FP8`` is refused by name (the FP8 method does not take it yet).

Each config hands :class:`~.fp4_method.Fp4LinearMethod` to the parallel linear
layers and records each layer's :class:`~loader.kernels.KernelChoice`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import FusedMoE, LinearBase, ParallelLMHead, QuantizationConfig

from .config import module_list
from .fp4_format import FP4_SCHEMES, MODELOPT_NVFP4, NVFP4_W4A4, Fp4Scheme
from .fp4_method import Fp4LinearMethod

if TYPE_CHECKING:
    from torch import nn

    from loader.kernels import KernelChoice
    from loader.layers import QuantizeMethodBase
    from loader.weights import CheckpointTensor, WeightStream

__all__ = ["KERNELS", "CompressedTensorsFp4Config", "Fp4Config", "ModelOptFp4Config", "fp4_scheme_from_ct",
           "modelopt_config_from_checkpoint"]

_WHERE = "config.json quantization_config"
KERNELS = ("auto", "dequantize")
"""``quantization_options["kernel"]``: both decode the weight at load (there is no FP4 matmul here)."""
MODELOPT_FP4_ALGOS = {"NVFP4": True, "W4A16_NVFP4": False}
"""ModelOpt ``quant_algo`` → whether its activations are FP4 too."""
_KV_SCALES = (".k_scale", ".v_scale")


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


@attrs.frozen
class ModelOptFp4Config(Fp4Config):
    """A ModelOpt NVFP4 checkpoint: ``exclude_modules`` are ModelOpt's wildcards (``fnmatch``), or names that a
    module's dotted name contains, as vLLM reads them.

    :ivar kv_cache_algo: ``kv_cache_quant_algo``; its ``k_scale``/``v_scale`` tensors are taken aside (the
        attention keeps its cache in the model's dtype).
    """

    name: ClassVar[str] = "modelopt"

    kv_cache_algo: str | None = None
    kv_scales: dict[str, CheckpointTensor] = attrs.field(factory=dict, eq=False, repr=False)

    def ignores(self, prefix: str) -> bool:
        return any(fnmatch.fnmatchcase(prefix, pattern) or (not any(c in pattern for c in "*?[") and
                                                            f".{pattern}." in f".{prefix}.")
                   for pattern in self.skip_modules)

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        return self._without_kv_scales(weights) if self.kv_cache_algo else weights

    def _without_kv_scales(self, weights: WeightStream) -> Iterator[tuple[str, CheckpointTensor]]:
        for name, tensor in weights:
            if name.endswith(_KV_SCALES):
                self.kv_scales[name] = tensor
                continue
            yield name, tensor

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "kv_cache": None if not self.kv_cache_algo else {
            "algo": self.kv_cache_algo, "scales": len(self.kv_scales), "applied": False}}


def fp4_kernel_option(options: Mapping[str, Any] | None, method: str) -> str:
    """``quantization_options["kernel"]`` checked (the only option FP4 checkpoints take)."""
    options = dict(options or {})
    unknown = sorted(set(options) - {"kernel"})
    if unknown:
        raise ConfigError(f"quantization_options: unknown {method} option(s) {unknown}; expected some of ['kernel']")
    kernel = options.get("kernel", "auto")
    if kernel not in KERNELS:
        raise ConfigError(f"quantization_options: kernel {kernel!r} is not one of {list(KERNELS)} for FP4 "
                          f"({method})")
    return str(kernel)


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


def _modelopt_fields(declared: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
    """``(quant_algo, group_size, excluded modules, kv cache algo)`` from the nested (``hf_quant_config.json``)
    or the flat (``config.json``) form."""
    nested = declared.get("quantization")
    if nested is not None:
        if not isinstance(nested, Mapping):
            raise ConfigError(f"{_WHERE}: quantization must be an object, found {nested!r}")
        return (nested.get("quant_algo"), nested.get("group_size"), nested.get("exclude_modules"),
                nested.get("kv_cache_quant_algo"))
    kv_scheme = declared.get("kv_cache_scheme")
    kv = "FP8" if isinstance(kv_scheme, Mapping) and kv_scheme.get("type") == "float" else kv_scheme
    excluded = declared.get("ignore", declared.get("exclude_modules"))
    return declared.get("quant_algo"), declared.get("group_size"), excluded, kv


def modelopt_config_from_checkpoint(declared: Mapping[str, Any],
                                    options: Mapping[str, Any] | None = None) -> ModelOptFp4Config:
    """The config of a ``quant_method: "modelopt"`` checkpoint; ``NVFP4`` and ``W4A16_NVFP4`` load."""
    algo, group_size, excluded, kv = _modelopt_fields(declared)
    algo_name = str(algo).upper() if isinstance(algo, str) else algo
    if algo_name == "FP8" or (isinstance(algo_name, str) and algo_name.startswith("FP8")):
        raise UnsupportedError(f"{_WHERE}: ModelOpt quant_algo {algo!r} is not supported yet; ModelOpt checkpoints "
                               f"load with quant_algo in {list(MODELOPT_FP4_ALGOS)}")
    if algo_name not in MODELOPT_FP4_ALGOS:
        raise UnsupportedError(f"{_WHERE}: ModelOpt quant_algo {algo!r} is not supported; expected one of "
                               f"{list(MODELOPT_FP4_ALGOS)}")
    if group_size not in (None, MODELOPT_NVFP4.group_size) or isinstance(group_size, bool):
        raise UnsupportedError(f"{_WHERE}: group_size {group_size!r} is not supported; ModelOpt NVFP4 has groups "
                               f"of {MODELOPT_NVFP4.group_size}")
    if kv is not None and not isinstance(kv, str):
        raise ConfigError(f"{_WHERE}: kv_cache_quant_algo must be a string or null, found {kv!r}")
    activations = MODELOPT_FP4_ALGOS[str(algo_name)]
    layout = MODELOPT_NVFP4 if activations else attrs.evolve(MODELOPT_NVFP4, input_name=None)
    return ModelOptFp4Config(scheme=layout, kernel=fp4_kernel_option(options, "modelopt"),
                             skip_modules=module_list(excluded, "exclude_modules", _WHERE),
                             activations_quantized=activations, kv_cache_algo=kv)
