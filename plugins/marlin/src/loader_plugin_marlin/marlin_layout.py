"""The Marlin layout: what a ``QuantizedWeight`` becomes for the CUDA kernel.

Marlin (IST-DASLab; the GEMM vLLM runs for GPTQ/AWQ on compute capability
8.0+) reads weights in the order its tensor-core fragments consume them:

* **act-order first**: input rows sorted by ``g_idx`` (``perm = argsort(g_idx)``)
  so each group's rows are contiguous; the kernel gathers activations by ``perm``;
* **16x16 tiles**: codes ``[K, N]`` are cut into tiles, tile rows laid out
  one after another (``[K/16, N*16]``);
* **a fixed 1024-element permutation** of each run of four tiles (which thread
  of a warp loads which element), with the codes of one int32 interleaved
  ``[0, 2, 4, 6, 1, 3, 5, 7]`` for 4-bit (``[0, 2, 1, 3]`` for 8-bit) so that
  the dequantization can shift pairs out at once; then packed low bits first,
  ``qweight`` int32 ``[K/16, N*16/p]``;
* **scales** permuted in runs of 64 columns (runs of 32 for one group over
  ``K``); **zero points** (asymmetric only) permuted like grouped scales,
  interleaved like the codes, and packed along ``N``.

:func:`repack` builds it and :func:`unpack` inverts it exactly; the tests
check ``unpack(repack(w)) == w`` for every bits x group x act-order x sym,
so the weight dequantized from the Marlin layout is the format's own.
:func:`marlin_unsupported_reason` says which weights the kernel cannot
take (they keep a CPU kernel or dequantize).
"""

from __future__ import annotations

import functools

import attrs
import torch

from .bit_packing import pack_int32, unpack_int32
from .quantized_weight import QuantizedWeight

__all__ = ["MARLIN_GROUP_SIZES", "MarlinWeight", "marlin_unsupported_reason", "repack", "unpack"]

MARLIN_GROUP_SIZES = (-1, 32, 64, 128)
_TILE = 16
_MIN_K = 128
_MIN_N = 64


@functools.cache
def _weight_perm(bits: int) -> torch.Tensor:
    """Where each element of four consecutive 16x16 tiles goes: the warp's fragment order, then the interleave."""
    order: list[int] = []
    for thread in range(32):
        column = thread // 4
        fragment = [16 * row + column + 8 * block
                    for block in (0, 1)
                    for row in (2 * (thread % 4), 2 * (thread % 4) + 1, 2 * (thread % 4 + 4),
                                2 * (thread % 4 + 4) + 1)]
        order += [index + 256 * tile for tile in range(4) for index in fragment]
    interleave = _interleave(bits)
    return torch.tensor(order).reshape(-1, len(interleave))[:, interleave].flatten()


def _interleave(bits: int) -> list[int]:
    return [0, 2, 4, 6, 1, 3, 5, 7] if bits == 4 else [0, 2, 1, 3]


@functools.cache
def _scale_perm(grouped: bool) -> torch.Tensor:
    if grouped:
        return torch.tensor([i + 8 * j for i in range(8) for j in range(8)])
    return torch.tensor([2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)])


def _inverse(perm: torch.Tensor) -> torch.Tensor:
    return torch.argsort(perm)


@attrs.frozen(eq=False)
class MarlinWeight:
    """One weight in the Marlin layout.

    :ivar qweight: int32 ``[K/16, N*16/p]``.
    :ivar scales: ``[G, N]`` permuted, in the activations' dtype.
    :ivar zeros: int32 ``[G, N/p]`` permuted and packed, or ``None`` when symmetric (``2**(bits-1)``).
    :ivar g_idx: int32 ``[K]`` sorted (act-order) or as given.
    :ivar perm: int64 ``[K]``, the input rows in kernel order, or ``None`` without act-order.
    """

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    g_idx: torch.Tensor
    perm: torch.Tensor | None
    bits: int
    group_size: int
    in_features: int
    out_features: int


def marlin_unsupported_reason(weight: QuantizedWeight) -> str | None:
    """Why the Marlin kernel cannot take ``weight`` (``None`` when it can)."""
    reason = marlin_shape_reason(weight.bits, weight.group_size, weight.in_features, weight.out_features,
                                 weight.groups)
    if reason is None and (int(weight.zeros.max()) >= 1 << weight.bits or int(weight.zeros.min()) < 0):
        return f"a zero point outside [0, {1 << weight.bits}) (a GPTQ v1 zero of 0 wraps) cannot be stored for Marlin"
    return reason


def marlin_shape_reason(bits: int, group_size: int, k: int, n: int, groups: int) -> str | None:
    """The part of :func:`marlin_unsupported_reason` the shapes decide (what ``loader inspect --layers`` can tell)."""
    if bits not in (4, 8):
        return f"Marlin takes 4- or 8-bit weights, not {bits}-bit"
    if group_size not in MARLIN_GROUP_SIZES:
        return f"Marlin takes group sizes {list(MARLIN_GROUP_SIZES)}, not {group_size}"
    if group_size != -1 and groups * group_size != k:
        return f"Marlin cannot take a partial last group ({k} input rows in groups of {group_size})"
    if k % _MIN_K:
        return f"Marlin needs input features a multiple of {_MIN_K}, found {k}"
    if n % _MIN_N:
        return f"Marlin needs output features a multiple of {_MIN_N}, found {n}"
    return None


def _grouped(weight_groups: int, group_size: int, k: int) -> bool:
    return group_size != -1 and group_size < k and weight_groups > 1


def repack(weight: QuantizedWeight, dtype: torch.dtype = torch.float16) -> MarlinWeight:
    """``weight`` in the Marlin layout (check :func:`marlin_unsupported_reason` first)."""
    reason = marlin_unsupported_reason(weight)
    if reason is not None:
        raise ValueError(reason)
    k, n, bits = weight.in_features, weight.out_features, weight.bits
    perm = torch.argsort(weight.g_idx, stable=True) if weight.act_order else None
    codes = (weight.codes if perm is None else weight.codes[perm]).to(torch.int64)
    tiles = codes.reshape(k // _TILE, _TILE, n // _TILE, _TILE).permute(0, 2, 1, 3).reshape(k // _TILE, n * _TILE)
    tiles = tiles.reshape(-1, 1024)[:, _weight_perm(bits)].reshape(k // _TILE, n * _TILE)
    grouped = _grouped(weight.groups, weight.group_size, k)
    scale_perm = _scale_perm(grouped)
    scales = weight.scales.reshape(-1, scale_perm.numel())[:, scale_perm].reshape(weight.groups, n)
    zeros = None
    if not weight.is_symmetric():
        interleave = torch.tensor(_interleave(bits))
        z = weight.zeros.reshape(-1, 64)[:, _scale_perm(True)]
        z = z.reshape(-1, interleave.numel())[:, interleave].reshape(weight.groups, n)
        zeros = pack_int32(z, bits, 1)
    g_idx = weight.g_idx if perm is None else weight.g_idx[perm]
    return MarlinWeight(qweight=pack_int32(tiles, bits, 1), scales=scales.to(dtype).contiguous(), zeros=zeros,
                        g_idx=g_idx.to(torch.int32).contiguous(), perm=perm, bits=bits,
                        group_size=weight.group_size, in_features=k, out_features=n)


def unpack(marlin: MarlinWeight) -> QuantizedWeight:
    """The inverse of :func:`repack`: codes, scales, zeros and ``g_idx`` in the checkpoint's row order."""
    k, n, bits = marlin.in_features, marlin.out_features, marlin.bits
    tiles = unpack_int32(marlin.qweight, bits, 1).to(torch.int64)
    tiles = tiles.reshape(-1, 1024)[:, _inverse(_weight_perm(bits))]
    codes = tiles.reshape(k // _TILE, n // _TILE, _TILE, _TILE).permute(0, 2, 1, 3).reshape(k, n)
    g_idx = marlin.g_idx
    if marlin.perm is not None:
        codes = codes[_inverse(marlin.perm)]
        g_idx = g_idx[_inverse(marlin.perm)]
    groups = int(marlin.scales.shape[0])
    grouped = _grouped(groups, marlin.group_size, k)
    scale_perm = _scale_perm(grouped)
    scales = marlin.scales.to(torch.float32).reshape(-1, scale_perm.numel())[:, _inverse(scale_perm)]
    if marlin.zeros is None:
        zeros = torch.full((groups, n), 1 << (bits - 1), dtype=torch.int32)
    else:
        interleave = torch.tensor(_interleave(bits))
        z = unpack_int32(marlin.zeros, bits, 1).to(torch.int64).reshape(-1, interleave.numel())[:, _inverse(interleave)]
        zeros = z.reshape(-1, 64)[:, _inverse(_scale_perm(True))].reshape(groups, n).to(torch.int32)
    return QuantizedWeight(codes=codes.to(torch.uint8), scales=scales.reshape(groups, n), zeros=zeros,
                           g_idx=g_idx.to(torch.int32), bits=bits, group_size=marlin.group_size)
