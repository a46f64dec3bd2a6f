"""GGUF Q4_0 / Q4_1 / Q4_K blocks as an affine 4-bit weight: codes, per-32-group scales and biases.

All three types are exact affine maps per group of 32 input columns, so they fit
:func:`loader.kernels.pack_int4` without re-quantizing anything:

- Q4_0 (``d: f16, qs[16]``): ``w = d * (q - 8)``, i.e. scale ``d``, bias ``-8 d``;
- Q4_1 (``d: f16, m: f16, qs[16]``): ``w = d * q + m``, i.e. scale ``d``, bias ``m``
  (torch's kernel then stores ``zero = m + 8 d``, since it computes ``(q - 8) * s + zero``);
- Q4_K (a 256-value super-block ``d, dmin: f16, scales[12], qs[128]``): eight groups of 32 with
  6-bit ``sc[j]``, ``m[j]``, ``w = (d sc[j]) q - dmin m[j]``, i.e. scale ``d sc[j]`` and bias
  ``-dmin m[j]``, both computed in float32 exactly as gguf-py does (an 11-bit by 6-bit product is exact).

:func:`affine_rows` reads the blocks under a checkpoint tensor handed to a
layer — a :class:`~loader_plugin_gguf.format.tensors.GGUFTensor` window, or one whose
rows llama.cpp's rotary interleave reordered
(:class:`loader.weights.RowPermutedTensor`) — and says why not (a string) when
the tensor cannot stay packed, so the caller falls back to dequantizing it.
"""

from __future__ import annotations

import attrs
import torch
from gguf.constants import GGMLQuantizationType

from loader.kernels import native_repack
from loader.weights import CheckpointTensor, RowPermutedTensor

from ..format.dequantize import block_shape
from ..format.kernels_kquants import QK_K, scale_min_k4, split_nibbles
from ..format.kernels_legacy import half_at, nibbles
from ..format.tensors import GGUFTensor

__all__ = ["GROUP_SIZE", "HALF_SPLIT_TYPES", "INT4X2_TYPES", "PACKED_TYPES", "AffineRows", "HalfSplitRows",
           "Int8Rows", "SuperBlockRows", "affine_rows", "decode_q4", "gguf_window", "half_split_rows", "int8_rows",
           "kernel_for", "packing_reason", "super_block_rows"]

Q = GGMLQuantizationType
GROUP_SIZE = 32
PACKED_TYPES = (Q.Q4_0, Q.Q4_1, Q.Q4_K)
"""Block types kept packed: the ones whose blocks are exactly ``code * scale + bias`` per 32 columns."""
INT4X2_TYPES = (Q.Q8_0,)
"""Block types kept as int8 codes with one scale per 32 columns, run as two int4 planes
(:func:`loader.kernels.pack_int8_grouped`): ``w = d * q``, ``q`` in ``[-128, 127]``."""
HALF_SPLIT_TYPES = (Q.Q4_0, Q.Q4_1)
"""Block types whose 32-value blocks store codes two per byte, column ``p`` low and ``p + 16`` high."""


@attrs.frozen(eq=False)
class AffineRows:
    """One part's weight ``[rows, cols]`` as ``codes * scales + biases`` per group of 32 columns.

    :ivar codes: uint8 ``[rows, cols]`` in ``[0, 16)``.
    :ivar scales: float32 ``[cols / 32, rows]`` (the blocks' ``d`` widened from float16; ``d sc`` for Q4_K).
    :ivar biases: float32 ``[cols / 32, rows]`` (``-8 d`` for Q4_0, ``m`` for Q4_1, ``-dmin m`` for Q4_K).
    :ivar ggml_type: the block type the rows came from.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    biases: torch.Tensor
    ggml_type: int


@attrs.frozen(eq=False)
class HalfSplitRows:
    """One Q4_0/Q4_1 part still two codes per byte, for :func:`~.half_split.pack_int4_half_split_parts`.

    :ivar blocks: uint8 ``[stored rows, cols / 32, size]``, the part's whole blocks as read (a view, not a copy).
    :ivar field_count: float16 fields leading each block: 1 (Q4_0: ``d``) or 2 (Q4_1: ``d, m``).
    :ivar order: int64 indices of ``blocks``' rows in the part's order, or ``None`` when they are in order
        (llama.cpp interleaves each head's q/k rows; the compiled helpers read them in place).
    """

    blocks: torch.Tensor
    field_count: int
    order: torch.Tensor | None = None

    @property
    def rows(self) -> int:
        """The part's rows."""
        return int(self.blocks.shape[0]) if self.order is None else int(self.order.numel())

    @property
    def qs(self) -> torch.Tensor:
        """The codes of the stored rows, uint8 ``[stored rows, cols / 32, 16]``: a view past each block's
        fields (the part's rows are ``qs[order]``)."""
        return self.blocks[:, :, 2 * self.field_count:]

    @property
    def fields(self) -> torch.Tensor:
        """The part's float16 fields, group-major ``[cols / 32, rows, field_count]`` (torch's scale order)."""
        blocks = self.blocks if self.order is None else self.blocks.index_select(0, self.order)
        return _group_major_fields(blocks, self.field_count)

    def scales_and_zeros_into(self, out: torch.Tensor, row_offset: int = 0) -> None:
        """Write rows ``row_offset:`` of torch's ``[cols / 32, rows, 2]`` scales and zeros (``w = (q - 8) s + z``).

        ``s = d`` and ``z = m + 8 d`` computed in float32 (``8 d`` is exact, so
        ``z`` is rounded once), then to ``out``'s dtype; Q4_0's ``z`` is 0. A
        bfloat16 ``out`` is written straight from the blocks by the compiled
        helpers when this machine has them (the same values, one pass).
        """
        rows = self.rows
        native = native_repack() if out.dtype == torch.bfloat16 and out.is_contiguous() else None
        if native is not None and self.blocks.stride(-1) == 1:
            native.q4_scales_bf16(self.blocks, self.field_count == 2, out, row_offset, self.order)
            return
        out = out[:, row_offset:row_offset + rows]
        fields = self.fields
        if self.field_count == 1:
            out[..., 0].copy_(fields[..., 0])
            out[..., 1].zero_()
            return
        widened = fields.to(torch.float32)
        widened[..., 1].add_(widened[..., 0], alpha=8)
        out.copy_(widened)


def _group_major_fields(blocks: torch.Tensor, count: int) -> torch.Tensor:
    """The first ``count`` float16 fields of blocks ``[rows, groups, size]`` as ``[groups, rows, count]``.

    Why: gathered as one 2- or 4-byte word per block and transposed as such,
    the fields arrive in torch's scale order with one copy; converting and
    transposing them as strided float16 pairs was a quarter of a packed load.
    """
    rows, groups, size = (int(s) for s in blocks.shape)
    width = 2 * count
    word = {2: torch.int16, 4: torch.int32}[width]
    if size % width == 0 and blocks.is_contiguous() and blocks.storage_offset() % width == 0:
        first = blocks.view(word)[..., 0]  # [rows, groups]: each block's leading fields as one word
    else:
        first = blocks[..., :width].contiguous().view(word)[..., 0]
    return first.t().contiguous().view(torch.float16).view(groups, rows, count)


def _decode_q4_k(blocks: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_K super-blocks ``[n, 144]`` -> codes ``[rows, cols]``, scales and biases ``[rows, cols / 32]``."""
    groups = QK_K // GROUP_SIZE
    sc, mn = scale_min_k4(blocks[:, 4:16])
    scales = half_at(blocks, 0) * sc.to(torch.float32)
    biases = -(half_at(blocks, 2) * mn.to(torch.float32))
    codes = split_nibbles(blocks[:, 16:144], groups // 2, GROUP_SIZE)  # [n, 4, 2, 32]: group j = 2 i + hi
    return codes.reshape(rows, -1), scales.view(rows, -1), biases.view(rows, -1)


def decode_q4(raw: torch.Tensor, ggml_type: int) -> AffineRows:
    """Split ``raw`` (uint8 ``[rows, row_bytes]`` of whole Q4_0/Q4_1/Q4_K blocks) into codes, scales, biases."""
    _, size = block_shape(ggml_type)
    rows = raw.shape[0]
    blocks = raw.contiguous().view(-1, size)
    if ggml_type == Q.Q4_K:
        codes, scales, biases = _decode_q4_k(blocks, rows)
        return AffineRows(codes, scales.t().contiguous(), biases.t().contiguous(), ggml_type)
    groups = blocks.shape[0] // rows if rows else 0
    d = half_at(blocks, 0).view(rows, groups)
    if ggml_type == Q.Q4_0:
        codes, biases = nibbles(blocks[:, 2:18]), d * -8
    elif ggml_type == Q.Q4_1:
        codes, biases = nibbles(blocks[:, 4:20]), half_at(blocks, 2).view(rows, groups)
    else:
        raise ValueError(f"ggml type {Q(ggml_type).name} is not one of {[t.name for t in PACKED_TYPES]}")
    return AffineRows(codes.reshape(rows, groups * GROUP_SIZE), d.t().contiguous(), biases.t().contiguous(),
                      ggml_type)


def gguf_window(tensor: CheckpointTensor) -> tuple[GGUFTensor, torch.Tensor | None] | str:
    """The GGUF window under ``tensor`` and the row order to apply (``None``: as stored), or why there is none."""
    perm = None
    if isinstance(tensor, RowPermutedTensor):
        perm, tensor = tensor.perm, tensor.base
    if not isinstance(tensor, GGUFTensor):
        return f"{type(tensor).__name__} is not a GGUF tensor"
    return tensor, perm


def kernel_for(tensor: CheckpointTensor) -> str:
    """The kernel this part's block type runs on — ``int4`` (:data:`PACKED_TYPES`), ``int4x2``
    (:data:`INT4X2_TYPES`) or ``dequantized`` — from the header alone."""
    found = gguf_window(tensor)
    if isinstance(found, str):
        return "dequantized"
    ggml_type = found[0].info.ggml_type
    return "int4" if ggml_type in PACKED_TYPES else "int4x2" if ggml_type in INT4X2_TYPES else "dequantized"


def packing_reason(tensor: CheckpointTensor) -> str | None:
    """Why this part cannot be packed (it must be dequantized instead), or ``None``; nothing is read."""
    found = gguf_window(tensor)
    if isinstance(found, str):
        return found
    window, _ = found
    if window.info.ggml_type not in PACKED_TYPES + INT4X2_TYPES:
        return f"ggml type {window.stored_type} has no packed int4 kernel"
    if len(window.shape) != 2:
        return f"a {len(window.shape)}-d tensor is not a linear weight"
    start, cols = window.columns
    if start % GROUP_SIZE or cols % GROUP_SIZE:
        return f"the tensor parallel split cuts a {GROUP_SIZE}-value group"
    return None


def _read_blocks(tensor: CheckpointTensor) -> tuple[GGUFTensor, torch.Tensor, int]:
    """The window, the whole blocks of its rows (in the part's row order) and the values before its columns."""
    window, raw, skip, order = _blocks_and_order(tensor)
    return window, (raw if order is None else raw.index_select(0, order)), skip


def _blocks_and_order(tensor: CheckpointTensor) -> tuple[GGUFTensor, torch.Tensor, int, torch.Tensor | None]:
    """:func:`_read_blocks` with the rows left where they are stored: the blocks spanning the part's rows, and
    the indices of its rows among them in the part's order (``None``: in order)."""
    found = gguf_window(tensor)
    if isinstance(found, str) or packing_reason(tensor) is not None:
        raise ValueError(f"{tensor.describe()}: cannot be packed ({packing_reason(tensor)})")
    window, perm = found
    order = None
    if perm is not None and perm.numel():
        lo, hi = int(perm.min()), int(perm.max())
        window = window.narrow(0, lo, hi - lo + 1)
        order = (perm - lo).contiguous()
    raw, skip = window.enclosing_blocks()
    window.stats.add(raw.numel() if order is None else order.numel() * raw.shape[1], tensors=1)
    return window, raw, skip, order


@attrs.frozen(eq=False)
class Int8Rows:
    """One Q8_0 part: its int8 codes (uint8 bytes ``[rows, cols / 32, 32]``, a view into the blocks read) and
    each block's ``d`` widened to float32, ``[cols / 32, rows]`` (``w = d * code`` exactly)."""

    codes: torch.Tensor
    scales: torch.Tensor


def int8_rows(tensor: CheckpointTensor) -> Int8Rows:
    """A Q8_0 part's codes and scales (:func:`packing_reason` ``None``): only its rows and whole blocks are read."""
    window, raw, skip = _read_blocks(tensor)
    if window.info.ggml_type not in INT4X2_TYPES:
        raise ValueError(f"ggml type {window.stored_type} is not one of {[t.name for t in INT4X2_TYPES]}")
    _, size = block_shape(window.info.ggml_type)
    rows = raw.shape[0]
    blocks = raw.contiguous().view(rows, -1, size)
    groups = slice(skip // GROUP_SIZE, (skip + window.shape[-1]) // GROUP_SIZE)
    blocks = blocks[:, groups]  # a TP split on a block boundary: this rank's blocks (Q8_0 blocks are 32 wide)
    scales = half_at(blocks.reshape(-1, size), 0).view(rows, -1).t().contiguous()
    return Int8Rows(blocks[:, :, 2:], scales)


def half_split_rows(tensor: CheckpointTensor) -> HalfSplitRows:
    """A Q4_0/Q4_1 part's codes left two per byte, with its scales and biases (:func:`packing_reason` ``None``).

    Why: repacked straight from these bytes, a layer never holds a byte per
    code (:func:`~.half_split.pack_int4_half_split`); the weight is the one
    :func:`affine_rows` describes.
    """
    window, raw, _, order = _blocks_and_order(tensor)
    ggml_type = window.info.ggml_type
    if ggml_type not in HALF_SPLIT_TYPES:
        raise ValueError(f"ggml type {Q(ggml_type).name} is not one of {[t.name for t in HALF_SPLIT_TYPES]}")
    _, size = block_shape(ggml_type)
    rows = raw.shape[0]
    blocks = raw.contiguous().view(rows, -1, size)
    return HalfSplitRows(blocks, 1 if ggml_type == Q.Q4_0 else 2, order)


@attrs.frozen(eq=False)
class SuperBlockRows:
    """One Q4_K part as read: its super-blocks uint8 ``[stored rows, cols / 256, 144]`` (a view) and the indices
    of its rows among them in the part's order (``None``: in order)."""

    blocks: torch.Tensor
    order: torch.Tensor | None = None


def super_block_rows(tensor: CheckpointTensor) -> SuperBlockRows:
    """A Q4_K part of whole super-blocks, its rows left where they are stored (:func:`packing_reason` ``None``)."""
    window, raw, skip, order = _blocks_and_order(tensor)
    _, size = block_shape(window.info.ggml_type)
    blocks = raw.contiguous().view(raw.shape[0], -1, size)
    if window.info.ggml_type != Q.Q4_K or skip or blocks.shape[1] * QK_K != window.shape[-1]:
        raise ValueError(f"{tensor.describe()}: not whole Q4_K super-blocks")
    return SuperBlockRows(blocks, order)


def affine_rows(tensor: CheckpointTensor) -> AffineRows:
    """This part's codes, scales and biases read from its blocks (:func:`packing_reason` must be ``None``).

    Only the rows and whole blocks of the window are read (a TP rank reads its
    own heads); the read is added to the tensor's :class:`~loader.weights.ReadStats`.
    """
    window, raw, skip = _read_blocks(tensor)
    decoded = decode_q4(raw, window.info.ggml_type)
    cols = window.shape[-1]
    if skip == 0 and decoded.codes.shape[1] == cols:
        return decoded
    # a TP split on a 32-group boundary inside a Q4_K super-block: keep this rank's groups
    groups = slice(skip // GROUP_SIZE, (skip + cols) // GROUP_SIZE)
    return AffineRows(decoded.codes[:, skip:skip + cols].contiguous(), decoded.scales[groups].contiguous(),
                      decoded.biases[groups].contiguous(), decoded.ggml_type)
