"""AWQ (AutoAWQ, GEMM version) checkpoints: config and tensors, converted to the internal representation.

AWQ writes ``quantization_config`` with ``quant_method: "awq"``, ``bits``
(or ``w_bit``) 4, ``group_size`` (or ``q_group_size``), ``zero_point`` and
``version: "gemm"``. Per layer it stores, packed along the *output* dim:

* ``qweight`` int32 ``[K, N/8]``;
* ``qzeros`` int32 ``[G, N/8]`` — zero points as they are (no minus one);
* ``scales`` ``[G, N]``.

Within each int32 the eight 4-bit values are interleaved: bits ``[4i, 4i+4)``
hold column ``AWQ_ORDER[i]`` of the word's eight, ``AWQ_ORDER = [0, 2, 4, 6,
1, 3, 5, 7]`` (the order AutoAWQ's GEMM kernel dequantizes in). The weight is
``(code - zero) * scale`` with contiguous groups (no act-order, no ``g_idx``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch

from loader.errors import UnsupportedError

from .bit_packing import unpack_int32
from .config import PackedQuantConfig, check_flag, kernel_option, module_list
from .layer_geometry import LayerGeometry
from .packed_words import PackedWords
from .param_specs import ParamSpec
from .quantized_weight import QuantizedWeight, default_g_idx

__all__ = ["AWQ_ORDER", "AWQ_SHIFTS", "AWQConfig", "AWQLayout", "awq_columns", "awq_config_from_checkpoint"]

METHOD_NAME = "awq"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_SHIFTS = tuple(4 * AWQ_ORDER.index(column) for column in range(8))
"""The bit at which column ``c`` of a word's eight starts (bits ``[4i, 4i + 4)`` hold column ``AWQ_ORDER[i]``)."""
GROUP_SIZES = (-1, 32, 64, 128, 256)
_WHERE = "config.json quantization_config"


@attrs.frozen
class AWQConfig(PackedQuantConfig):
    """An AWQ (GEMM) checkpoint: 4-bit, asymmetric, contiguous groups."""

    name: ClassVar[str] = METHOD_NAME

    @property
    def layout(self) -> AWQLayout:
        return AWQLayout(self)


@attrs.frozen
class AWQLayout:
    """AWQ's three tensors per layer, packed along the output dim."""

    config: AWQConfig
    input_pack: bool = False
    output_pack: bool = True

    def params(self, geometry: LayerGeometry) -> list[ParamSpec]:
        pack, rows, cols, groups = self.config.pack_factor, geometry.rows, geometry.cols, geometry.groups
        scale_dim = geometry.scale_input_dim
        return [
            ParamSpec("qweight", (rows, cols // pack), torch.int32, output_dim=1, input_dim=0, packed_dim=1,
                      pack_factor=pack),
            ParamSpec("qzeros", (groups, cols // pack), torch.int32, output_dim=1, input_dim=scale_dim, packed_dim=1,
                      pack_factor=pack),
            ParamSpec("scales", (groups, cols), torch.float32, output_dim=1, input_dim=scale_dim),
        ]

    def to_quantized(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> QuantizedWeight:
        bits, group_size = self.config.bits, self.config.group_size
        g_idx = default_g_idx(geometry.rows, group_size)
        return QuantizedWeight(codes=awq_columns(tensors["qweight"], bits), scales=tensors["scales"].to(torch.float32),
                               zeros=awq_columns(tensors["qzeros"], bits).to(torch.int32), g_idx=g_idx, bits=bits,
                               group_size=group_size)

    @property
    def word_tensor(self) -> str:
        """The tensor holding the codes' words."""
        return "qweight"

    def packed_words(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> PackedWords:
        """``qweight`` as it is (codes along the output, interleaved), beside the groups :meth:`to_quantized`
        reads."""
        zeros = awq_columns(tensors["qzeros"], self.config.bits).to(torch.int32)
        return PackedWords(tensors["qweight"], "output", AWQ_SHIFTS, tensors["scales"].to(torch.float32), zeros,
                           default_g_idx(geometry.rows, self.config.group_size))


def awq_columns(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ words ``[rows, N / 8]`` unpacked to ``[rows, N]`` codes, each column back in its place (unpacked
    position ``8c + i`` holds column ``8c + AWQ_ORDER[i]``)."""
    place = torch.argsort(torch.tensor(AWQ_ORDER))
    values = unpack_int32(packed, bits, 1)
    return values.reshape(values.shape[0], -1, len(AWQ_ORDER))[:, :, place].reshape(values.shape)


def awq_config_from_checkpoint(declared: Mapping[str, Any], options: Mapping[str, Any] | None = None) -> AWQConfig:
    """The config of a checkpoint whose ``quantization_config`` names AWQ; every bad field is an error."""
    bits = declared.get("bits", declared.get("w_bit"))
    if isinstance(bits, bool) or bits != 4:
        raise UnsupportedError(f"{_WHERE}: AWQ bits {bits!r} is not supported; AWQ checkpoints load with 4 bits")
    group_size = declared.get("group_size", declared.get("q_group_size", 128))
    if isinstance(group_size, bool) or group_size not in GROUP_SIZES:
        raise UnsupportedError(f"{_WHERE}: AWQ group_size {group_size!r} is not one of {list(GROUP_SIZES)}")
    version = str(declared.get("version", "gemm")).lower()
    if version != "gemm":
        raise UnsupportedError(f"{_WHERE}: AWQ version {version!r} is not supported; only 'gemm' checkpoints load")
    if not check_flag(declared, "zero_point", True, _WHERE):
        raise UnsupportedError(f"{_WHERE}: AWQ without zero points (zero_point: false) is not supported")
    return AWQConfig(
        bits=4, group_size=int(group_size), act_order=False, sym=False, kernel=kernel_option(options, METHOD_NAME),
        skip_modules=module_list(declared.get("modules_to_not_convert"), "modules_to_not_convert", _WHERE),
    )
