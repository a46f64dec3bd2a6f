"""``BitsAndBytesConfig``: what a load quantizes, and how, for both entry paths.

Two ways in, one config:

* in flight — ``load_model(..., quantization="bitsandbytes",
  quantization_options={...})``; the options arrive as
  ``LoadOptions.quantization_options`` and are checked here;
* pre-quantized — ``config.json`` carries ``quantization_config`` with
  ``quant_method: "bitsandbytes"`` as ``transformers`` writes it; the packed
  tensors' own headers then say the blocksize and quant type of each weight.

It imports the quantize method it hands out (and torch with it); the entry
point imports it, through :mod:`.detection`, only for a load that asks for
bitsandbytes or whose checkpoint declares it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import torch

from loader.errors import ConfigError, UnsupportedError
from loader.layers import FusedMoE, LinearBase, QuantizationConfig

from .grouping import group_packed_weights
from .linear_method import BitsAndBytesLinearMethod
from .names import METHOD_NAME
from .packed_tensor import Packed4bitTensor
from .quant_state import BLOCKSIZES, QUANT_TYPES

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import QuantizeMethodBase
    from loader.weights import CheckpointTensor, WeightStream

__all__ = [
    "DEFAULT_SKIP_MODULES",
    "METHOD_NAME",
    "OPTION_NAMES",
    "check_compute_dtype",
    "BitsAndBytesConfig",
    "config_from_checkpoint",
    "config_from_options",
]

DEFAULT_SKIP_MODULES = ("lm_head",)
COMPUTE_DTYPES = ("float32", "float16", "bfloat16")
OPTION_NAMES = ("quant_type", "blocksize", "double_quant", "compute_dtype", "skip_modules")

def _matches(prefix: str, module: str) -> bool:
    """Whether dotted ``module`` names ``prefix`` or one of its parents, by whole components."""
    return f".{module}." in f".{prefix}."


@attrs.frozen
class BitsAndBytesConfig(QuantizationConfig):
    """Settings of a bitsandbytes 4-bit load.

    :ivar quant_type: ``"nf4"`` or ``"fp4"``.
    :ivar blocksize: elements per ``absmax`` block (in flight; a pre-quantized
        checkpoint's tensors carry their own, 64 when ``transformers`` wrote them).
    :ivar double_quant: quantize the ``absmax`` vector too (8-bit, blocks of 256).
    :ivar compute_dtype: dtype of the matmul (``None``: the activations' dtype).
    :ivar skip_modules: dotted module names kept unquantized.
    :ivar prequantized: whether the checkpoint already holds packed 4-bit weights.
    """

    name: ClassVar[str] = METHOD_NAME

    quant_type: str = "nf4"
    blocksize: int = 64
    double_quant: bool = False
    compute_dtype: str | None = None
    skip_modules: tuple[str, ...] = DEFAULT_SKIP_MODULES
    prequantized: bool = False

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.name,
            "quant_type": self.quant_type,
            "blocksize": self.blocksize,
            "double_quant": self.double_quant,
            "compute_dtype": self.compute_dtype,
            "skip_modules": list(self.skip_modules),
            "prequantized": self.prequantized,
        }

    def ignores(self, prefix: str) -> bool:
        """Whether ``skip_modules`` names the module ``prefix`` or one of its parents, by whole components.

        The core's :meth:`~loader.layers.QuantizationConfig.skip`
        asks this for fused layers and for each of their checkpoint parts.
        """
        return any(_matches(prefix, m) for m in self.skip_modules)

    def get_quant_method(self, layer: nn.Module, prefix: str) -> QuantizeMethodBase | None:
        """:class:`~loader_plugin_bnb.linear_method.BitsAndBytesLinearMethod` for every parallel linear layer.

        Mixture-of-experts experts are not quantized: a pre-quantized
        checkpoint holds them dense (``transformers`` 5 quantizes ``nn.Linear``
        modules only, and its experts are fused 3-D parameters), so they load
        as written; quantizing them in flight is refused, naming the layer.
        """
        if isinstance(layer, FusedMoE):
            if self.prequantized:
                return None
            raise UnsupportedError(
                f"{prefix}: mixture-of-experts experts are not supported with bitsandbytes in-flight quantization "
                "(it quantizes linear layers only); load without quantization='bitsandbytes', or use a GPTQ or "
                "compressed-tensors checkpoint of the model")
        if not isinstance(layer, LinearBase):
            return None
        return BitsAndBytesLinearMethod(self)

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        """Bundle a pre-quantized checkpoint's side tensors with their packed weights.

        The pipeline passes the format's stream through this before the
        model's ``load_weights``, so a model sees one ``X.weight`` per
        quantized weight and never the ``.absmax`` / ``.quant_state`` siblings.
        """
        if not self.prequantized:
            return weights
        return _refuse_packed_experts(group_packed_weights(weights))

    @property
    def torch_compute_dtype(self) -> Any:
        """``compute_dtype`` as a ``torch.dtype`` (or ``None``)."""
        if self.compute_dtype is None:
            return None
        return getattr(torch, self.compute_dtype)


def _check_quant_type(value: Any, where: str) -> str:
    if value not in QUANT_TYPES:
        raise UnsupportedError(f"{where}: quant type {value!r} is not supported; use 'nf4' or 'fp4'")
    return str(value)


def check_compute_dtype(value: Any, where: str) -> str | None:
    if value is None:
        return None
    text = str(value).removeprefix("torch.")
    aliases = {"fp32": "float32", "float": "float32", "fp16": "float16", "half": "float16",
               "bf16": "bfloat16"}
    text = aliases.get(text, text)
    if text not in COMPUTE_DTYPES:
        raise UnsupportedError(f"{where}: compute dtype {value!r} is not one of {COMPUTE_DTYPES}")
    return text


def _check_skip_modules(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_SKIP_MODULES
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(
        isinstance(v, str) and v for v in value
    ):
        raise ConfigError(f"{where}: skip modules must be a list of module names, found {value!r}")
    return tuple(value)


def config_from_options(options: Mapping[str, Any] | None) -> BitsAndBytesConfig:
    """The in-flight config from ``quantization_options``; unknown or bad options are errors."""
    where = "quantization_options"
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise ConfigError(
            f"{where}: unknown bitsandbytes option(s) {unknown}; expected some of {list(OPTION_NAMES)}"
        )
    blocksize = options.get("blocksize", 64)
    if blocksize not in BLOCKSIZES or isinstance(blocksize, bool):
        raise UnsupportedError(f"{where}: blocksize {blocksize!r} is not one of {BLOCKSIZES}")
    double_quant = options.get("double_quant", False)
    if not isinstance(double_quant, bool):
        raise ConfigError(f"{where}: double_quant must be true or false, found {double_quant!r}")
    return BitsAndBytesConfig(
        quant_type=_check_quant_type(options.get("quant_type", "nf4"), where),
        blocksize=int(blocksize),
        double_quant=double_quant,
        compute_dtype=check_compute_dtype(options.get("compute_dtype"), where),
        skip_modules=_check_skip_modules(options.get("skip_modules"), where),
    )


def config_from_checkpoint(declared: Mapping[str, Any]) -> BitsAndBytesConfig:
    """The config of a checkpoint whose ``quantization_config`` names bitsandbytes.

    Only 4-bit checkpoints with ``uint8`` storage are supported; an 8-bit
    (LLM.int8) checkpoint is refused with a message saying so.
    """
    where = "config.json quantization_config"
    if declared.get("load_in_8bit") or declared.get("_load_in_8bit"):
        raise UnsupportedError(f"{where}: load_in_8bit (LLM.int8) checkpoints are not supported; only 4-bit")
    if not (declared.get("load_in_4bit") or declared.get("_load_in_4bit")):
        raise UnsupportedError(f"{where}: expected load_in_4bit: true for a bitsandbytes 4-bit checkpoint")
    storage = declared.get("bnb_4bit_quant_storage", "uint8")
    if storage not in (None, "uint8"):
        raise UnsupportedError(f"{where}: bnb_4bit_quant_storage {storage!r} is not supported; only 'uint8'")
    double_quant = declared.get("bnb_4bit_use_double_quant", False)
    return BitsAndBytesConfig(
        quant_type=_check_quant_type(declared.get("bnb_4bit_quant_type", "fp4"), where),
        blocksize=64,
        double_quant=bool(double_quant),
        compute_dtype=check_compute_dtype(declared.get("bnb_4bit_compute_dtype"), where),
        skip_modules=_check_skip_modules(declared.get("llm_int8_skip_modules"), where),
        prequantized=True,
    )


_EXPERT_TENSOR = re.compile(r"\.experts\.\d+\.")


def _refuse_packed_experts(weights: WeightStream) -> Iterator[tuple[str, CheckpointTensor]]:
    """Pass the grouped stream through, refusing a 4-bit expert weight (``transformers`` 4 quantized each
    expert's ``nn.Linear``): experts are not supported with bitsandbytes."""
    for name, tensor in weights:
        if isinstance(tensor, Packed4bitTensor) and _EXPERT_TENSOR.search(name):
            raise UnsupportedError(
                f"{tensor.describe()}: a bitsandbytes 4-bit expert weight; mixture-of-experts experts are not "
                "supported with bitsandbytes (checkpoints that transformers 5 writes keep them unquantized)")
        yield name, tensor
