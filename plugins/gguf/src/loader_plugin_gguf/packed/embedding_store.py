"""What a packed GGUF embedding keeps for each kernel, how many bytes that is, and the lookups and head products
read from it.

Per kernel (:class:`~.embedding.GGUFEmbeddingMethod` decides which): ``int8`` (Q8_0/Q6_K codes
``[groups, rows, block]`` and float32 block scales, and a tied head's scales in the kernel dtype), ``int4x2``
(Q8_0 codes as the head's two int4 planes, rows read back from them), ``blocks`` (the raw blocks) and
``blocks+int4`` (the blocks and a tied head's packed int4 weight). Each builder writes this rank's padded table
once; :func:`expected_buffers` is what a unit from the packed-weights bundle must be to stand in for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

import attrs
import torch
from gguf.constants import GGMLQuantizationType

from loader.kernels import Int4CpuWeight, Int8GroupedWeight, KernelChoice, TokenPlan, pack_int4, pack_int8_grouped

from ..format.dequantize import block_shape, dequantize_into
from ..format.kernels_kquants import q6_k_codes
from ..format.kernels_legacy import half_at
from ..format.tensors import GGUFTensor
from .int8_head import Int8HeadWeight
from .plan import int4_packed_bytes
from .q4_blocks import GROUP_SIZE, PACKED_TYPES, affine_rows, int8_rows
from .q4_k_packing import pack_q4_k_parts

if TYPE_CHECKING:
    from torch import nn

    from loader.layers import NarrowedPart

__all__ = ["BUILDERS", "HEAD_KERNEL_TYPES", "INT8_BLOCKS", "Q", "GGUFEmbeddingState", "buffer", "exact_rows",
           "expected_buffers", "int8_head", "int8_planes", "kept_bytes"]

Q = GGMLQuantizationType
INT8_BLOCKS = {Q.Q8_0: 32, Q.Q6_K: 16}
"""Symmetric block types kept as int8 codes and one float32 scale per block of this many columns (Q8_0: ``d``;
Q6_K: ``d*sc`` of each 16-value group, codes ``q - 32``): ``codes * scale`` is gguf-py's value exactly."""
HEAD_KERNEL_TYPES = (*INT8_BLOCKS, *PACKED_TYPES)
"""Block types a tied head multiplies with directly (int8 codes per block, or packed int4)."""


@attrs.define
class GGUFEmbeddingState:
    """This rank's table size, the narrowed rows handed in, whether a head is tied, and what was kept."""

    prefix: str
    rows: int
    cols: int
    params_dtype: torch.dtype
    part: NarrowedPart | None = None
    tied: bool = False
    lookups: bool = True
    """False for an untied output head (:class:`~.embedding.GGUFHeadMethod`): nothing is looked up, rows only
    refine logits."""
    ggml_type: int | None = None
    kernel_dtype: torch.dtype = torch.bfloat16
    choice: KernelChoice | None = None
    plans: tuple[TokenPlan, ...] = ()
    """A planned head's path per token count (see :func:`~.embedding.planned_head`); empty otherwise."""


def kept_bytes(state: GGUFEmbeddingState, kernel: str, window: GGUFTensor) -> int:
    """The bytes ``kernel`` keeps for this rank's padded table: what the load's buffers will hold."""
    if kernel == "int4x2":
        # the planes (an int4 weight of twice the rows, as a Q8_0 linear keeps) and float32 block scales
        groups = state.cols // INT8_BLOCKS[Q.Q8_0]
        return int4_packed_bytes(2 * state.rows, state.cols, state.kernel_dtype) + groups * state.rows * 4
    if kernel == "int8":
        # int8 codes, float32 block scales, and the tied head's copy in the kernel dtype
        groups = state.cols // INT8_BLOCKS[Q(window.info.ggml_type)]
        copied = state.tied and state.kernel_dtype != torch.float32
        head = groups * state.rows * state.kernel_dtype.itemsize if copied else 0
        return state.rows * state.cols + groups * state.rows * 4 + head
    if kernel.startswith("blocks"):
        block, size = block_shape(window.info.ggml_type)
        head = int4_packed_bytes(state.rows, state.cols, state.kernel_dtype) if kernel == "blocks+int4" else 0
        return state.rows * (state.cols // block * size) + head
    return 0


def buffer(layer: nn.Module, name: str) -> torch.Tensor:
    return cast(torch.Tensor, getattr(layer, name))


def int8_planes(layer: nn.Module, state: GGUFEmbeddingState) -> Int8GroupedWeight:
    """The ``int4x2`` kernel's weight over this layer's buffers."""
    planes = Int4CpuWeight(buffer(layer, "q8_planes"), buffer(layer, "q8_planes_scales_and_zeros"),
                           INT8_BLOCKS[Q.Q8_0], state.cols)
    return Int8GroupedWeight(planes, state.rows)


def exact_rows(layer: nn.Module, state: GGUFEmbeddingState, ids: torch.Tensor) -> torch.Tensor:
    """The rows ``ids`` of the kept blocks, float32 ``[*ids.shape, cols]``: exact, whatever the load's dtype."""
    flat = ids.reshape(-1)
    if cast(KernelChoice, state.choice).kernel == "int4x2":
        groups = state.cols // INT8_BLOCKS[Q.Q8_0]
        codes = int8_planes(layer, state).codes(flat).view(-1, groups, INT8_BLOCKS[Q.Q8_0])
        scales = buffer(layer, "q8_scales")[:, flat].t()  # [n, groups]
        rows = (codes.to(torch.float32) * scales.unsqueeze(-1)).reshape(-1, state.cols)
    elif state.ggml_type in INT8_BLOCKS:
        codes = buffer(layer, "q8_codes")[:, flat]  # [groups, n, block]
        scales = buffer(layer, "q8_scales")[:, flat]
        rows = (codes.to(torch.float32) * scales.unsqueeze(-1)).transpose(0, 1).reshape(-1, state.cols)
    else:
        rows = torch.empty(flat.numel(), state.cols, dtype=torch.float32, device=flat.device)
        dequantize_into(buffer(layer, "blocks").index_select(0, flat), cast(int, state.ggml_type), rows)
    return rows.view(*ids.shape, state.cols)


def int8_head(layer: nn.Module, state: GGUFEmbeddingState) -> Int8HeadWeight:
    """The ``int8`` head's weight over this layer's buffers: the codes, and the scales in the kernel's dtype (a
    tied head's copy made at load, not cast on every token)."""
    head_scales = getattr(layer, "q8_head_scales", None)
    scales = head_scales if isinstance(head_scales, torch.Tensor) else buffer(layer, "q8_scales")
    return Int8HeadWeight(buffer(layer, "q8_codes"), scales.to(state.kernel_dtype))


def _int8_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """Int8 codes ``[groups, rows, block]`` and float32 scales ``[groups, rows]`` (:data:`INT8_BLOCKS`), and a
    tied head's scales in the kernel dtype."""
    raw, _ = window.enclosing_blocks()
    window.stats.add(raw.numel(), tensors=1)
    ggml_type = Q(window.info.ggml_type)
    block = INT8_BLOCKS[ggml_type]
    groups, real = state.cols // block, raw.shape[0]
    # written once each: the file's rows copied in, only the padding rows zeroed
    codes = torch.empty(groups, state.rows, block, dtype=torch.int8)
    scales = torch.empty(groups, state.rows, dtype=torch.float32)
    if ggml_type == Q.Q8_0:
        _, size = block_shape(Q.Q8_0)
        blocks = raw.reshape(real, groups, size)
        codes[:, :real].copy_(blocks[:, :, 2:].transpose(0, 1).view(torch.int8))
        scales[:, :real].copy_(half_at(blocks.reshape(-1, size), 0).view(real, groups).t())
    else:
        _, size = block_shape(ggml_type)
        super_codes, super_scales = q6_k_codes(raw.contiguous().view(-1, size))
        codes[:, :real].copy_(super_codes.view(real, groups, block).transpose(0, 1))
        scales[:, :real].copy_(super_scales.view(real, groups).t())
    codes[:, real:].zero_()
    scales[:, real:].zero_()
    buffers = {"q8_codes": codes, "q8_scales": scales}
    if state.tied and state.kernel_dtype != scales.dtype:
        buffers["q8_head_scales"] = scales.to(state.kernel_dtype)
    return buffers


def _int4x2_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """Q8_0 codes as the head's two int4 planes (rows read back from them), float32 scales ``[groups, rows]``."""
    decoded = int8_rows(window)  # codes: a view of the file's blocks, the planes are built straight from it
    codes, scales = decoded.codes, decoded.scales
    real = int(codes.shape[0])
    if real < state.rows:  # this rank's share of the padded vocabulary: zero codes and scales below
        codes = torch.nn.functional.pad(codes, (0, 0, 0, 0, 0, state.rows - real))
        scales = torch.nn.functional.pad(scales, (0, state.rows - real))
    weight = pack_int8_grouped(codes, scales, state.kernel_dtype)
    return {"q8_scales": scales, "q8_planes": weight.planes.data,
            "q8_planes_scales_and_zeros": weight.planes.scales_and_zeros}


def _blocks_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """The rows' raw blocks, the padding rows zero (zero bytes dequantize to 0.0)."""
    raw, _ = window.enclosing_blocks()
    window.stats.add(raw.numel(), tensors=1)
    blocks = torch.empty(state.rows, raw.shape[1], dtype=torch.uint8)  # each byte written once: fresh pages are dear
    blocks[: raw.shape[0]].copy_(raw)
    blocks[raw.shape[0]:].zero_()
    return {"blocks": blocks}


def _blocks_and_head_buffers(state: GGUFEmbeddingState, window: GGUFTensor) -> dict[str, torch.Tensor]:
    """The raw blocks, and the tied head's packed int4 weight built from the same blocks (Q4_K rows that fill
    the table by the compiled helpers, :mod:`.q4_k_packing`)."""
    compiled = pack_q4_k_parts([window], state.kernel_dtype) if window.shape[0] == state.rows else None
    if compiled is not None:
        return {**_blocks_buffers(state, window), "packed_weight": compiled.data,
                "packed_scales_and_zeros": compiled.scales_and_zeros}
    decoded = affine_rows(window)
    pad = state.rows - decoded.codes.shape[0]
    codes = torch.nn.functional.pad(decoded.codes, (0, 0, 0, pad))
    scales = torch.nn.functional.pad(decoded.scales, (0, pad))
    biases = torch.nn.functional.pad(decoded.biases, (0, pad))
    packed = pack_int4(codes, scales, biases, GROUP_SIZE, state.kernel_dtype)
    return {**_blocks_buffers(state, window), "packed_weight": packed.data,
            "packed_scales_and_zeros": packed.scales_and_zeros}


BUILDERS = {"int8": _int8_buffers, "int4x2": _int4x2_buffers, "blocks": _blocks_buffers,
             "blocks+int4": _blocks_and_head_buffers}


def expected_buffers(state: GGUFEmbeddingState, window: GGUFTensor,
                      kernel: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """What each of ``kernel``'s buffers must be (dtype, shape) for this rank's table: a stored unit is checked
    against it."""
    rows, cols, dtype = state.rows, state.cols, state.kernel_dtype
    if kernel == "int4x2":
        groups = cols // INT8_BLOCKS[Q.Q8_0]
        return {"q8_scales": (torch.float32, (groups, rows)), "q8_planes": (torch.uint8, (2 * rows, cols // 2)),
                "q8_planes_scales_and_zeros": (dtype, (cols // GROUP_SIZE, 2 * rows, 2))}
    if kernel == "int8":
        block = INT8_BLOCKS[Q(window.info.ggml_type)]
        expected = {"q8_codes": (torch.int8, (cols // block, rows, block)),
                    "q8_scales": (torch.float32, (cols // block, rows))}
        if state.tied and dtype != torch.float32:
            expected["q8_head_scales"] = (dtype, (cols // block, rows))
        return expected
    expected = {"blocks": (torch.uint8, (rows, window.nbytes // max(window.shape[0], 1)))}
    if kernel == "blocks+int4":
        expected["packed_weight"] = (torch.uint8, (rows, cols // 2))
        expected["packed_scales_and_zeros"] = (dtype, (cols // GROUP_SIZE, rows, 2))
    return expected
