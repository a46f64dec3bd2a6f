"""The seam between layers and quantization plugins.

A quantizable layer never creates its own parameters: it asks its quantize
method to (``create_weights``), routes its forward through ``apply``, and the
pipeline calls ``process_weights_after_loading`` once every tensor is in.
Quantization plugins subclass :class:`QuantizationConfig` and
:class:`LinearMethodBase`; model plugins never see the difference.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from torch import nn

    from ..weights import WeightStream

__all__ = [
    "LinearMethodBase",
    "QuantizationConfig",
    "QuantizeMethodBase",
    "UnquantizedLinearMethod",
    "WeightLoader",
]

WeightLoader = Callable[..., None]
"""``weight_loader(param, checkpoint_tensor, shard_id=None)`` as carried by parameters."""


class QuantizationConfig:
    """A checkpoint's (or a request's) quantization settings, owned by one plugin (subclass it)."""

    #: the method name users pass as ``quantization=``; also shown by ``loader inspect``.
    name: ClassVar[str] = ""

    def describe(self) -> dict[str, Any]:
        """A JSON-friendly summary for ``loader inspect`` and load reports."""
        return {"method": self.name}

    def skip(self, prefix: str) -> bool:
        """Whether the layer at ``prefix`` stays unquantized (default: never)."""
        return False

    def wrap_weights(self, weights: WeightStream) -> WeightStream:
        """Adapt the checkpoint stream before the model's ``load_weights`` sees it (default: unchanged).

        A pre-quantized format whose weights come as several tensors (packed data
        plus scales) can bundle them into one tensor per weight here, so model
        plugins route it like a dense weight and need no quantization-specific names.
        """
        return weights


class QuantizeMethodBase(abc.ABC):
    """How one layer's parameters are created, used and finished."""

    @abc.abstractmethod
    def create_weights(self, layer: nn.Module, *args: Any, **kwargs: Any) -> None:
        """Register the layer's parameters (on whatever device is current)."""

    @abc.abstractmethod
    def apply(self, layer: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Run the layer's math with these parameters."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:  # noqa: B027 - optional step
        """Finish the layout after loading (repack, permute); default: nothing."""


class LinearMethodBase(QuantizeMethodBase):
    """Quantize method for the parallel linear layers."""

    @abc.abstractmethod
    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        weight_loader: WeightLoader,
        **extra: Any,
    ) -> None:
        """Register this rank's parameters on ``layer``.

        :param input_size_per_partition: this rank's input features.
        :param output_partition_sizes: this rank's output rows of each fused
            part (one entry for a plain linear, q/k/v or gate/up for fused ones).
        :param input_size: the full input features.
        :param output_size: the full output features.
        :param params_dtype: the dtype of unquantized parameters.
        :param weight_loader: the layer's loader, to attach to each parameter
            (or wrap) so checkpoint tensors land in the right shard.
        """

    @abc.abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """Compute ``x @ W.T + bias`` for this rank's shard."""


class UnquantizedLinearMethod(LinearMethodBase):
    """Plain dense weights: one ``weight`` parameter ``(sum(output parts), input)``."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        weight_loader: WeightLoader,
        **extra: Any,
    ) -> None:
        import torch

        weight = torch.nn.Parameter(
            torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            requires_grad=False,
        )
        weight.output_dim = 0  # type: ignore[attr-defined]
        weight.input_dim = 1  # type: ignore[attr-defined]
        weight.weight_loader = weight_loader  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        from typing import cast

        import torch
        import torch.nn.functional as F

        return F.linear(x, cast(torch.Tensor, layer.weight), bias)
