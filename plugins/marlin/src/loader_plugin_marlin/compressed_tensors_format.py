"""compressed-tensors ``pack-quantized`` groups (what llm-compressor writes for W4A16/W8A16).

A group (one entry of ``config_groups``, see
:mod:`~loader_plugin_marlin.compressed_tensors_config` for how layers are
matched to groups) with ``format: "pack-quantized"`` has ``weights`` that say
``num_bits`` (4/8), ``type: "int"``, ``symmetric``, ``strategy`` (``group``
with ``group_size``, or ``channel``) and ``actorder`` (``group``: a
``weight_g_idx`` is stored; ``weight`` or none: groups are contiguous).
Activation quantization is not weight-only and is refused.

Per layer, with the checkpoint's ``nn.Linear`` orientation:

* ``weight_packed`` int32 ``[N, K/p]`` — packed along the *input* dim, low bits
  first; each value stored as ``signed + 2**(bits-1)``;
* ``weight_scale`` ``[N, G]``;
* ``weight_zero_point`` int32 ``[N/p, G]`` (asymmetric only) — packed along the
  *output* dim, offset like the codes;
* ``weight_shape`` ``[2]`` — the unpacked ``[N, K]``, checked and not kept;
* ``weight_g_idx`` int32 ``[K]`` with ``actorder: "group"``.

The weight is ``(q - zp) * scale`` in signed terms, which is ``(stored code -
stored zero) * scale`` — the internal representation keeps the stored values,
with ``2**(bits-1)`` as the zero point of symmetric checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch

from loader.errors import ConfigError, UnsupportedError

from .bit_packing import unpack_int32
from .config import PackedQuantConfig, kernel_option
from .gptq_format import check_g_idx
from .layer_geometry import LayerGeometry
from .packed_words import IN_ORDER, PackedWords
from .param_specs import ParamSpec
from .quantized_weight import QuantizedWeight, default_g_idx

__all__ = ["CompressedTensorsLayout", "PackQuantizedConfig", "group_settings", "pack_quantized_scheme"]

METHOD_NAME = "compressed-tensors"
FORMAT = "pack-quantized"
_WHERE = "config.json quantization_config"


@attrs.frozen
class PackQuantizedConfig(PackedQuantConfig):
    """One compressed-tensors ``pack-quantized`` group (the checkpoint's groups and ``ignore`` list are
    :class:`~loader_plugin_marlin.compressed_tensors_config.CompressedTensorsConfig`'s).

    :ivar per_tensor: ``strategy: tensor``: one scale per checkpoint module (a ``[1]`` ``weight_scale``; each
        part of a fused layer has its own), symmetric.
    """

    name: ClassVar[str] = METHOD_NAME

    per_tensor: bool = False

    @property
    def layout(self) -> CompressedTensorsLayout:
        return CompressedTensorsLayout(self)


@attrs.frozen
class CompressedTensorsLayout:
    """The ``weight_*`` tensors of one layer."""

    config: PackQuantizedConfig
    input_pack: bool = True
    output_pack: bool = True

    def params(self, geometry: LayerGeometry) -> list[ParamSpec]:
        cfg = self.config
        pack, rows, cols, groups = cfg.pack_factor, geometry.rows, geometry.cols, geometry.groups
        scale_dim = 1 if geometry.shard_groups else None
        specs = [
            ParamSpec("weight_packed", (cols, rows // pack), torch.int32, output_dim=0, input_dim=1, packed_dim=1,
                      pack_factor=pack),
            ParamSpec("weight_scale", (cols, groups), torch.float32, output_dim=0, input_dim=scale_dim)
            if not cfg.per_tensor else ParamSpec("weight_scale", (len(geometry.parts),), torch.float32,
                                                 kind="part_scalar"),
            ParamSpec("weight_shape", (2,), torch.int64, kind="shape"),
        ]
        if not cfg.sym:
            specs.append(ParamSpec("weight_zero_point", (cols // pack, groups), torch.int32, output_dim=0,
                                   input_dim=scale_dim, packed_dim=0, pack_factor=pack))
        if cfg.act_order:
            specs.append(ParamSpec("weight_g_idx", (rows,), torch.int32, input_dim=0, kind="g_idx"))
        return specs

    def to_quantized(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> QuantizedWeight:
        cfg = self.config
        codes = unpack_int32(tensors["weight_packed"], cfg.bits, 1).t().contiguous()
        scales, zeros, g_idx = self.groups(tensors, geometry)
        return QuantizedWeight(codes=codes, scales=scales, zeros=zeros, g_idx=g_idx, bits=cfg.bits,
                               group_size=cfg.group_size)

    @property
    def word_tensor(self) -> str:
        """The tensor holding the codes' words."""
        return "weight_packed"

    def packed_words(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> PackedWords:
        """``weight_packed`` as it is (``[N, K / 8]``, seen as ``[K / 8, N]``), beside :meth:`groups`."""
        scales, zeros, g_idx = self.groups(tensors, geometry)
        return PackedWords(tensors["weight_packed"].t(), "input", IN_ORDER, scales, zeros, g_idx)

    def groups(self, tensors: Mapping[str, torch.Tensor],
               geometry: LayerGeometry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The layer's scales ``[G, N]`` (float32), integer zero points ``[G, N]`` and checked local ``g_idx``
        (what :meth:`to_quantized` holds besides the codes)."""
        cfg = self.config
        if cfg.per_tensor:  # each part's one scale, for each of its rows on this rank
            per_part = tensors["weight_scale"].to(torch.float32)
            scales = torch.repeat_interleave(per_part, torch.tensor(geometry.parts)).reshape(1, -1)
        else:
            scales = tensors["weight_scale"].to(torch.float32).t().contiguous()
        if cfg.sym:
            zeros = torch.full(scales.shape, 1 << (cfg.bits - 1), dtype=torch.int32)
        else:
            zeros = unpack_int32(tensors["weight_zero_point"], cfg.bits, 0).to(torch.int32).t().contiguous()
        if cfg.act_order:
            g_idx = check_g_idx(tensors["weight_g_idx"], geometry.groups, cfg.group_size, act_order=True,
                                whole=geometry.whole_input, first_group=geometry.first_group,
                                what=f"{geometry.prefix}.weight")
        else:
            g_idx = default_g_idx(geometry.rows, cfg.group_size)
        return scales, zeros, g_idx


def _weights(name: str, scheme: Mapping[str, Any]) -> Mapping[str, Any]:
    """The group's ``weights``, for a weight-only scheme (a packed layer computes in the activations' dtype)."""
    if scheme.get("input_activations") or scheme.get("output_activations"):
        raise UnsupportedError(f"{_WHERE}: config_groups.{name} quantizes activations; {FORMAT} loads weight-only "
                               "(W4A16/W8A16) schemes")
    weights = scheme.get("weights")
    if not isinstance(weights, Mapping):
        raise ConfigError(f"{_WHERE}: config_groups.{name}.weights must be an object, found {weights!r}")
    return weights


def group_settings(name: str, scheme: Mapping[str, Any]) -> tuple[int, int, bool, bool]:
    """``(bits, group_size, act_order, sym)`` of an integer weight-only group; every bad field is named."""
    weights = _weights(name, scheme)
    where = f"{_WHERE} config_groups.{name}.weights"
    bits = weights.get("num_bits")
    if isinstance(bits, bool) or bits not in (4, 8):
        raise UnsupportedError(f"{where}: num_bits {bits!r} is not supported; integer weights load with 4 or 8 bits")
    if weights.get("type", "int") != "int":
        raise UnsupportedError(f"{where}: type {weights.get('type')!r} is not supported; only 'int'")
    strategy = weights.get("strategy")
    group_size = -1
    if strategy == "tensor" and not weights.get("symmetric", True):
        raise UnsupportedError(f"{where}: strategy 'tensor' with asymmetric weights is not supported; only symmetric")
    if strategy == "group":
        declared_size = weights.get("group_size")
        if isinstance(declared_size, bool) or not isinstance(declared_size, int) or declared_size <= 0:
            raise ConfigError(f"{where}: strategy 'group' needs a positive group_size, found {declared_size!r}")
        group_size = declared_size
    elif strategy not in ("channel", "tensor"):
        raise UnsupportedError(f"{where}: strategy {strategy!r} is not supported; expected 'group', 'channel' or "
                               "'tensor'")
    actorder = weights.get("actorder")
    if actorder not in (None, "group", "weight", "static"):
        raise UnsupportedError(f"{where}: actorder {actorder!r} is not supported")
    if weights.get("dynamic"):
        raise UnsupportedError(f"{where}: dynamic weight quantization is not supported")
    symmetric = weights.get("symmetric", True)
    if not isinstance(symmetric, bool):
        raise ConfigError(f"{where}: symmetric must be true or false, found {symmetric!r}")
    return int(bits), int(group_size), actorder == "group" and group_size != -1, symmetric


def pack_quantized_scheme(name: str, scheme: Mapping[str, Any],
                          options: Mapping[str, Any] | None = None) -> PackQuantizedConfig:
    """The config of one ``pack-quantized`` group (``name`` in ``config_groups``); every bad field is named.

    The group's layers are chosen by :class:`~loader_plugin_marlin.compressed_tensors_config.CompressedTensorsConfig`
    (targets, ``ignore``), so this config quantizes whatever it is asked for, the output head included.
    """
    bits, group_size, act_order, sym = group_settings(name, scheme)
    per_tensor = dict(scheme.get("weights") or {}).get("strategy") == "tensor"
    return PackQuantizedConfig(bits=bits, group_size=group_size, act_order=act_order, sym=sym,
                               kernel=kernel_option(options, METHOD_NAME), lm_head=True, per_tensor=per_tensor)
