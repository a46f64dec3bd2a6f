"""One 4-bit layer's codes as its checkpoint packs them (eight to an int32 word), beside its groups.

A leaf: the formats' layouts make a :class:`PackedWords` (:class:`WordPackedLayout`) and
:mod:`~loader_plugin_marlin.word_packing` packs it for torch's int4 kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

if TYPE_CHECKING:
    import torch

    from .layer_geometry import LayerGeometry

__all__ = ["IN_ORDER", "PackedWords", "WordPackedLayout"]

IN_ORDER = tuple(range(0, 32, 4))
"""The bit at which each of a word's eight codes starts when they are stored low bits first (GPTQ,
compressed-tensors)."""


@attrs.frozen(eq=False)
class PackedWords:
    """One layer's 4-bit codes in their int32 words, and its groups.

    :ivar words: int32, ``[K / 8, N]`` when ``along`` is ``"input"`` (a transposed view for compressed-tensors'
        ``[N, K / 8]``), else ``[K, N / 8]``.
    :ivar along: the dimension a word's eight codes run along (:meth:`loader.kernels.NativeRepack.int4pack_words`).
    :ivar shifts: the bit at which each of a word's codes starts, in order along that dimension.
    :ivar scales: float32 ``[G, N]``.
    :ivar zeros: int32 ``[G, N]``: ``w = (code - zero) * scale``.
    :ivar g_idx: int32 ``[K]``, local and checked.
    """

    words: torch.Tensor
    along: str
    shifts: tuple[int, ...]
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor


@runtime_checkable
class WordPackedLayout(Protocol):
    """A layout whose 4-bit codes can be read as :class:`PackedWords` (the same values checked, the same errors
    raised as by its ``to_quantized``)."""

    @property
    def word_tensor(self) -> str:
        """The checkpoint tensor holding the codes' words (``qweight``, ``weight_packed``)."""

    def packed_words(self, tensors: Mapping[str, torch.Tensor], geometry: LayerGeometry) -> PackedWords: ...
