"""NVIDIA ModelOpt checkpoints (``quant_method: "modelopt"``): which method each ``quant_algo`` loads with.

ModelOpt writes its settings to ``hf_quant_config.json`` (``{"producer": ...,
"quantization": {"quant_algo", "group_size", "exclude_modules",
"kv_cache_quant_algo"}}``) and, in newer exports, to ``config.json``'s
``quantization_config`` (flat: ``quant_algo``, ``group_size``, ``ignore``,
``kv_cache_scheme``); both forms are read from ``quantization_config``. A
checkpoint whose settings are only in ``hf_quant_config.json`` is not seen:
the quantization hook receives ``config.json`` alone.

* ``NVFP4`` / ``W4A16_NVFP4`` — :class:`ModelOptFp4Config`: ``weight`` uint8
  ``[N, K/2]``, ``weight_scale`` float8_e4m3fn ``[N, K/16]``, ``weight_scale_2``
  float32 ``[]`` (multiplied), and for ``NVFP4`` an ``input_scale`` that is read
  and checked but not applied: the weights are decoded and the activations
  kept in the model's dtype, as vLLM's Marlin FP4 path runs NVFP4 on GPUs
  before compute capability 10.0 (there is no CPU reference to match).
* ``FP8`` — :class:`ModelOptFp8Config`, the FP8 method with per-tensor weight
  scales and a static per-tensor ``input_scale`` (inputs rounded to FP8 with it,
  as vLLM runs them).

``exclude_modules`` entries are ModelOpt's wildcards (``fnmatch``) or names a
module's dotted name contains, as vLLM reads them. With a KV cache algorithm,
the ``k_scale``/``v_scale`` tensors are taken aside and reported (the
attention keeps its cache in the model's dtype).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import QuantizationConfig

from .config import module_list
from .fp4_config import Fp4Config, fp4_kernel_option
from .fp4_format import MODELOPT_NVFP4
from .fp8_config import Fp8Config, fp8_kernel_option
from .fp8_scheme import ActivationQuant, Fp8Scheme

if TYPE_CHECKING:
    from loader.weights import CheckpointTensor, WeightStream

__all__ = ["FP4_ALGOS", "FP8_ALGOS", "ModelOptFp4Config", "ModelOptFp8Config", "modelopt_config_from_checkpoint"]

_WHERE = "config.json quantization_config"
FP4_ALGOS = {"NVFP4": True, "W4A16_NVFP4": False}
"""``quant_algo`` → whether its activations are FP4 too."""
FP8_ALGOS = ("FP8",)
_KV_SCALES = (".k_scale", ".v_scale")


def excluded(patterns: tuple[str, ...], prefix: str) -> bool:
    """Whether ModelOpt's ``exclude_modules`` name module ``prefix``: a wildcard matching it, or a plain name
    among its dotted components."""
    return any(fnmatch.fnmatchcase(prefix, pattern) if any(c in pattern for c in "*?[") else
               f".{pattern}." in f".{prefix}." for pattern in patterns)


def kv_scales_aside(weights: WeightStream, found: dict[str, CheckpointTensor]) -> Iterator[tuple[str,
                                                                                                  CheckpointTensor]]:
    """The stream without the KV cache's ``k_scale``/``v_scale`` tensors, which go to ``found``."""
    for name, tensor in weights:
        if name.endswith(_KV_SCALES):
            found[name] = tensor
            continue
        yield name, tensor


def _kv_aside(algo: str | None, scales: dict[str, CheckpointTensor], weights: WeightStream) -> WeightStream:
    """The stream without the KV cache scales when the export declares a KV cache algorithm (kept in ``scales``)."""
    return kv_scales_aside(weights, scales) if algo else weights


def _kv_record(algo: str | None, scales: dict[str, CheckpointTensor]) -> dict[str, Any] | None:
    return {"algo": algo, "scales": len(scales), "applied": False} if algo else None


@attrs.frozen
class ModelOptFp4Config(Fp4Config):
    """A ModelOpt NVFP4 checkpoint.

    :ivar kv_cache_algo: ``kv_cache_quant_algo`` (its scales are taken aside, not applied).
    """

    name: ClassVar[str] = "modelopt"

    kv_cache_algo: str | None = None
    kv_scales: dict[str, CheckpointTensor] = attrs.field(factory=dict, eq=False, repr=False)

    def ignores(self, prefix: str) -> bool:
        return excluded(self.skip_modules, prefix)

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        return _kv_aside(self.kv_cache_algo, self.kv_scales, weights)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "quant_algo": "NVFP4" if self.activations_quantized else "W4A16_NVFP4",
                "kv_cache": _kv_record(self.kv_cache_algo, self.kv_scales)}


@attrs.frozen
class ModelOptFp8Config(Fp8Config):
    """A ModelOpt FP8 checkpoint (per-tensor weight and input scales).

    :ivar kv_cache_algo: ``kv_cache_quant_algo`` (its scales are taken aside, not applied).
    """

    name: ClassVar[str] = "modelopt"

    kv_cache_algo: str | None = None
    kv_scales: dict[str, CheckpointTensor] = attrs.field(factory=dict, eq=False, repr=False)

    def ignores(self, prefix: str) -> bool:
        return excluded(self.skip_modules, prefix)

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        return _kv_aside(self.kv_cache_algo, self.kv_scales, weights)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "quant_algo": "FP8", "kv_cache": _kv_record(self.kv_cache_algo, self.kv_scales)}


def _fields(declared: Mapping[str, Any]) -> tuple[Any, Any, Any, Any]:
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
    return declared.get("quant_algo"), declared.get("group_size"), declared.get("ignore",
                                                                                declared.get("exclude_modules")), kv


def modelopt_config_from_checkpoint(declared: Mapping[str, Any],
                                    options: Mapping[str, Any] | None = None) -> QuantizationConfig:
    """The config of a ``quant_method: "modelopt"`` checkpoint; ``NVFP4``, ``W4A16_NVFP4`` and ``FP8`` load."""
    algo, group_size, excluded_modules, kv = _fields(declared)
    algo_name = algo.upper() if isinstance(algo, str) else algo
    known = [*FP4_ALGOS, *FP8_ALGOS]
    if algo_name not in known:
        raise UnsupportedError(f"{_WHERE}: ModelOpt quant_algo {algo!r} is not supported; expected one of {known}")
    if kv is not None and not isinstance(kv, str):
        raise ConfigError(f"{_WHERE}: kv_cache_quant_algo must be a string or null, found {kv!r}")
    skip = module_list(excluded_modules, "exclude_modules", _WHERE)
    if algo_name in FP8_ALGOS:
        scheme = Fp8Scheme("tensor", activations=ActivationQuant("tensor", dynamic=False))
        return ModelOptFp8Config(scheme=scheme, kernel=fp8_kernel_option(options, "modelopt"), skip_modules=skip,
                                 kv_cache_algo=kv)
    if group_size not in (None, MODELOPT_NVFP4.group_size) or isinstance(group_size, bool):
        raise UnsupportedError(f"{_WHERE}: group_size {group_size!r} is not supported; ModelOpt NVFP4 has groups "
                               f"of {MODELOPT_NVFP4.group_size}")
    activations = FP4_ALGOS[str(algo_name)]
    layout = MODELOPT_NVFP4 if activations else attrs.evolve(MODELOPT_NVFP4, input_name=None)
    return ModelOptFp4Config(scheme=layout, kernel=fp4_kernel_option(options, "modelopt"), skip_modules=skip,
                             activations_quantized=activations, kv_cache_algo=kv)
