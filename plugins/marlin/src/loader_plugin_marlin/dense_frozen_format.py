"""compressed-tensors ``dense`` groups with integer weights: checkpoints saved uncompressed, quantized at load.

llm-compressor's ``save_pretrained(..., save_compressed=False)`` writes
``format: "dense"`` and ``quantization_status: "frozen"``: each linear keeps
its original float ``weight`` beside the ``weight_scale`` and
``weight_zero_point`` (int8, written for symmetric schemes too) its
calibration chose, and ``weight_g_idx`` with group act-order. The weight is
not the quantized one: compressed-tensors quantizes it in every forward
(measured: a W4A16 tiny Llama's logits move by 22% relative if the floats are
used as they are). Here it is quantized once, at load, exactly as
compressed-tensors does (``round(clamp(w / scale + zero, qmin, qmax))``, in
float32), into the same :class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`
as a ``pack-quantized`` checkpoint — so the layer gets the packed kernels,
not a float weight four times its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch

from loader.errors import UnsupportedError

from .compressed_tensors_format import METHOD_NAME, group_settings
from .config import PackedQuantConfig, kernel_option
from .gptq_format import check_g_idx
from .layer_geometry import LayerGeometry
from .param_specs import ParamSpec
from .quantized_weight import QuantizedWeight, default_g_idx

__all__ = ["DenseFrozenConfig", "DenseFrozenLayout", "dense_frozen_scheme"]

_WHERE = "config.json quantization_config"


@attrs.frozen
class DenseFrozenConfig(PackedQuantConfig):
    """One ``dense`` group whose weights are integers of ``bits`` bits: floats quantized at load."""

    name: ClassVar[str] = METHOD_NAME

    @property
    def layout(self) -> DenseFrozenLayout:
        return DenseFrozenLayout(self)


@attrs.frozen
class DenseFrozenLayout:
    """A float ``weight`` with its ``weight_scale``/``weight_zero_point`` (and ``weight_g_idx``)."""

    config: DenseFrozenConfig
    input_pack: bool = False
    output_pack: bool = False

    def params(self, geometry: LayerGeometry) -> list[ParamSpec]:
        cols, rows, groups = geometry.cols, geometry.rows, geometry.groups
        scale_dim = 1 if geometry.shard_groups else None
        specs = [
            ParamSpec("weight", (cols, rows), torch.float32, output_dim=0, input_dim=1),
            ParamSpec("weight_scale", (cols, groups), torch.float32, output_dim=0, input_dim=scale_dim),
            ParamSpec("weight_zero_point", (cols, groups), torch.int8, output_dim=0, input_dim=scale_dim),
        ]
        if self.config.act_order:
            specs.append(ParamSpec("weight_g_idx", (rows,), torch.int32, input_dim=0, kind="g_idx"))
        return specs

    def to_quantized(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> QuantizedWeight:
        """The codes compressed-tensors' forward would compute from the float weight, and its scales."""
        cfg = self.config
        if cfg.act_order:
            g_idx = check_g_idx(tensors["weight_g_idx"], geometry.groups, cfg.group_size, act_order=True,
                                whole=geometry.whole_input, first_group=geometry.first_group,
                                what=f"{geometry.prefix}.weight")
        else:
            g_idx = default_g_idx(geometry.rows, cfg.group_size)
        g = g_idx.long()
        scale = tensors["weight_scale"].to(torch.float32)[:, g]  # [N, K]
        zero = tensors["weight_zero_point"].to(torch.float32)[:, g]
        half = 1 << (cfg.bits - 1)
        signed = torch.round(torch.clamp(tensors["weight"].to(torch.float32) / scale + zero, -half, half - 1))
        codes = (signed + half).to(torch.int32).t().contiguous()
        zeros = (tensors["weight_zero_point"].to(torch.int32) + half).t().contiguous()
        scales = tensors["weight_scale"].to(torch.float32).t().contiguous()
        return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, g_idx=g_idx, bits=cfg.bits,
                               group_size=cfg.group_size)


def dense_frozen_scheme(name: str, scheme: Mapping[str, Any],
                        options: Mapping[str, Any] | None = None) -> DenseFrozenConfig | None:
    """The config of one ``dense`` group: ``None`` when it quantizes no weights (the floats are the weights),
    a :class:`DenseFrozenConfig` for integer weights; anything else is refused by name."""
    weights = scheme.get("weights")
    if weights is None:
        return None
    if scheme.get("input_activations") or scheme.get("output_activations"):
        raise UnsupportedError(f"{_WHERE}: config_groups.{name} is saved dense with activation quantization, "
                               "which is not supported; save it compressed")
    if isinstance(weights, Mapping) and weights.get("type") == "float":
        raise UnsupportedError(f"{_WHERE}: config_groups.{name} is saved dense with float weight quantization, "
                               "which is not supported; save it compressed")
    bits, group_size, act_order, sym = group_settings(name, scheme)
    return DenseFrozenConfig(bits=bits, group_size=group_size, act_order=act_order, sym=sym,
                             kernel=kernel_option(options, METHOD_NAME), lm_head=True)
