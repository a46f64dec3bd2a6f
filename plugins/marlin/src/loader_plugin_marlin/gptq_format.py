"""GPTQ's stored tensors → :class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`, checked.

GPTQ stores, per linear layer: ``qweight`` int32 ``[K / p, N]`` (``p = 32 /
bits`` codes per word along the *input* dim), ``qzeros`` int32 ``[G, N / p]``
(packed along the *output* dim), ``scales`` ``[G, N]`` and ``g_idx`` int32
``[K]``. Checkpoint format ``gptq`` (v1) stores each zero point minus one;
``gptq_v2`` stores it as it is. v1's stored value is read back as
``stored + 1`` without wrapping, as the GPTQ kernels do: an asymmetric zero
of 0, written as ``-1 & mask``, comes back as ``2**bits``.

Shapes are checked by the layer as tensors arrive; what only the values can
tell (``g_idx`` in range, consistent with ``group_size``) is checked here,
each error naming the layer and the tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import torch

from loader.errors import CheckpointFormatError

from .bit_packing import unpack_int32
from .layer_geometry import LayerGeometry
from .packed_words import IN_ORDER, PackedWords
from .param_specs import ParamSpec
from .quantized_weight import QuantizedWeight, default_g_idx

if TYPE_CHECKING:
    from .config import GPTQConfig

__all__ = ["GPTQLayout", "check_g_idx", "gptq_to_quantized", "gptq_zeros"]


def check_g_idx(g_idx: torch.Tensor, groups: int, group_size: int, *, act_order: bool, whole: bool,
                first_group: int, what: str) -> torch.Tensor:
    """``g_idx`` (global group numbers) as local rows of this rank's ``scales``, after checking it.

    :param groups: rows of this rank's ``scales``.
    :param act_order: whether the config declares act-order (GPTQ ``desc_act``); without it
        ``g_idx`` must be the contiguous ``k // group_size``.
    :param whole: whether this rank holds every input row (then act-order
        group sizes can be checked exactly).
    :param first_group: the global group of this rank's first ``scales`` row.
    :param what: the layer, for messages.
    """
    g = g_idx.to(torch.int64)
    low, high = int(g.min()), int(g.max())
    if low < first_group or high >= first_group + groups:
        raise CheckpointFormatError(
            f"{what}.g_idx: group numbers span [{low}, {high}] but scales have groups "
            f"[{first_group}, {first_group + groups - 1}]"
        )
    rows = int(g.numel())
    if not act_order:
        expected = default_g_idx(rows, group_size, first_group * max(group_size, 0)).to(torch.int64)
        if not torch.equal(g, expected.to(g.device)):
            bad = int((g != expected.to(g.device)).nonzero()[0, 0])
            raise CheckpointFormatError(
                f"{what}.g_idx: row {bad} is in group {int(g[bad])}, but with group_size {group_size} without "
                f"act-order it belongs to group {int(expected[bad])}"
            )
    elif group_size != -1:
        counts = torch.bincount(g - first_group, minlength=groups)
        if whole:
            expected_counts = torch.full((groups,), group_size, dtype=counts.dtype)
            expected_counts[-1] = rows - group_size * (groups - 1)
            wrong = (counts != expected_counts.to(counts.device)).nonzero()
        else:
            wrong = (counts > group_size).nonzero()
        if wrong.numel():
            group = int(wrong[0, 0])
            raise CheckpointFormatError(
                f"{what}.g_idx: group {group + first_group} has {int(counts[group])} rows, inconsistent with "
                f"group_size {group_size} over {rows} input rows"
            )
    return (g - first_group).to(torch.int32)


def gptq_to_quantized(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor,
                      *, bits: int, group_size: int, zeros_minus_one: bool) -> QuantizedWeight:
    """Unpack one layer's GPTQ tensors (``g_idx`` already local and checked) into the internal representation."""
    codes = unpack_int32(qweight, bits, 0)
    zeros = gptq_zeros(qzeros, bits, zeros_minus_one)
    return QuantizedWeight(codes=codes, scales=scales.to(torch.float32), zeros=zeros, g_idx=g_idx.to(torch.int32),
                           bits=bits, group_size=group_size)


def gptq_zeros(qzeros: torch.Tensor, bits: int, zeros_minus_one: bool) -> torch.Tensor:
    """The integer zero points ``[G, N]`` of ``qzeros`` (v1's stored value plus one, without wrapping)."""
    zeros = unpack_int32(qzeros, bits, 1).to(torch.int32)
    return zeros + 1 if zeros_minus_one else zeros


@attrs.frozen
class GPTQLayout:
    """GPTQ's four tensors per layer (``scales`` kept in float32 so 16-bit checkpoint scales stay exact)."""

    config: GPTQConfig
    input_pack: bool = True
    output_pack: bool = True

    def params(self, geometry: LayerGeometry) -> list[ParamSpec]:
        pack, rows, cols, groups = self.config.pack_factor, geometry.rows, geometry.cols, geometry.groups
        scale_dim = geometry.scale_input_dim
        return [
            ParamSpec("qweight", (rows // pack, cols), torch.int32, output_dim=1, input_dim=0, packed_dim=0,
                      pack_factor=pack),
            ParamSpec("qzeros", (groups, cols // pack), torch.int32, output_dim=1, input_dim=scale_dim, packed_dim=1,
                      pack_factor=pack),
            ParamSpec("scales", (groups, cols), torch.float32, output_dim=1, input_dim=scale_dim),
            ParamSpec("g_idx", (rows,), torch.int32, input_dim=0, kind="g_idx"),
        ]

    def to_quantized(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> QuantizedWeight:
        cfg = self.config
        g_idx = check_g_idx(tensors["g_idx"], geometry.groups, cfg.group_size, act_order=cfg.act_order,
                            whole=geometry.whole_input, first_group=geometry.first_group, what=geometry.prefix)
        return gptq_to_quantized(tensors["qweight"], tensors["qzeros"], tensors["scales"], g_idx, bits=cfg.bits,
                                 group_size=cfg.group_size, zeros_minus_one=cfg.zeros_stored_minus_one)

    @property
    def word_tensor(self) -> str:
        """The tensor holding the codes' words."""
        return "qweight"

    def packed_words(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> PackedWords:
        """``qweight`` as it is (codes along the input), beside the groups :meth:`to_quantized` reads."""
        cfg = self.config
        g_idx = check_g_idx(tensors["g_idx"], geometry.groups, cfg.group_size, act_order=cfg.act_order,
                            whole=geometry.whole_input, first_group=geometry.first_group, what=geometry.prefix)
        return PackedWords(tensors["qweight"], "input", IN_ORDER, tensors["scales"].to(torch.float32),
                           gptq_zeros(tensors["qzeros"], cfg.bits, cfg.zeros_stored_minus_one), g_idx)
