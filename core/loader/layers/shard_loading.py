"""How a checkpoint tensor lands in one rank's (fused, packed) parameter of a parallel linear layer.

The parallel linears (:mod:`loader.layers.linear`) describe their split —
which parts they fuse (:meth:`ShardedWeightLoading.shard_ids`) and where each
part's rows come from and go (:meth:`ShardedWeightLoading.output_part`) — and
inherit from here the one implementation of the arithmetic: narrowing a
checkpoint tensor to this rank (``shard_slice``, nothing read), splitting a
pre-fused tensor into its parts, and copying into place (``weight_loader``).
A quantize method with parameters of its own reuses all of it through its
parameters' :class:`~loader.layers.param_layout.ParamLayout`.

Units along ``output_dim`` are logical output features, divided by the
layout's pack factor for parameters packed along that dimension; a part that
would begin or end inside a packed element is refused, never floored.
Along ``input_dim`` the parameter's own per-rank extent is the shard size, so
packed or grouped parameters (scales per group) narrow correctly too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import attrs

from .._mapped_parameters import fill_parameter
from ..errors import PackedSplitError
from .default_loader import check_shape
from .param_layout import ParamLayout, layout_of, param_shape

if TYPE_CHECKING:
    import torch

    from ..weights import CheckpointTensor

__all__ = ["NarrowedPart", "OutputPart", "ShardId", "ShardedWeightLoading"]

ShardId = int | str | None
"""A part of a fused layer: ``"q"``/``"k"``/``"v"``, ``0``/``1`` (gate/up), or ``None`` for the whole."""


@attrs.frozen
class OutputPart:
    """Where one part of a layer's output lives, in logical output features.

    ``start``/``length``: the rows of the part's checkpoint tensor this rank
    reads; ``offset``: where they land in the rank's (fused) parameter;
    ``full``: the rows the whole checkpoint tensor of the part has.
    """

    start: int
    length: int
    offset: int
    full: int


@attrs.frozen
class NarrowedPart:
    """One part of a checkpoint tensor, narrowed to this rank (nothing read), and where it lands.

    :ivar shard_id: the part (``"q"``, ``0``, ... or ``None``).
    :ivar narrowed: this rank's piece of ``whole``.
    :ivar whole: the part's full checkpoint tensor, for methods whose statistics
        span the whole checkpoint module (bitsandbytes' double quantization).
    :ivar offset: the first destination row along the layout's ``output_dim``.
    :ivar size: the destination rows.
    :ivar rows: ``(start, length)`` of ``narrowed`` in ``whole`` along ``output_dim``, or ``None``.
    :ivar cols: ``(start, length)`` along ``input_dim`` when the layer splits its input, else ``None``.
    :ivar expert: for a fused-experts parameter, the local expert (index along its first dimension) the part
        belongs to; ``offset``/``size`` and the layout's dims then describe that expert's slice ``param[expert]``.
    """

    shard_id: ShardId
    narrowed: CheckpointTensor
    whole: CheckpointTensor
    offset: int
    size: int
    rows: tuple[int, int] | None
    cols: tuple[int, int] | None
    expert: int | None = None


class ShardedWeightLoading:
    """The TP split and weight loading shared by the parallel linear layers (a mixin).

    Subclasses set ``prefix``, ``tp_rank`` and ``tp_size``, override
    :meth:`_output_part` (and :meth:`_shard_ids` when fused), and set
    :attr:`_splits_input` when their input features are split over ranks.
    """

    _splits_input: ClassVar[bool] = False
    prefix: str
    tp_rank: int
    tp_size: int

    def shard_ids(self) -> list[ShardId]:
        """The parts of this layer in the order they are stacked (``[None]`` when not fused)."""
        return self._shard_ids()

    def output_part(self, shard_id: ShardId = None) -> OutputPart:
        """Where this rank's rows of part ``shard_id`` come from and land, in logical features.

        Raises ``ValueError`` for a shard id the layer does not have.
        """
        return self._output_part(shard_id)

    def _output_part(self, shard_id: ShardId) -> OutputPart:
        raise NotImplementedError

    def _shard_ids(self) -> list[ShardId]:
        return [None]

    @property
    def display_name(self) -> str:
        """How messages name this layer: its prefix, or its class for a layer built without one."""
        return self.prefix or type(self).__name__

    def _what(self, shard_id: ShardId = None) -> str:
        return self.display_name if shard_id is None else f"{self.display_name} shard {shard_id!r}"

    def _packed(self, value: int, pack: int, role: str, shard_id: ShardId) -> int:
        """``value`` logical features in stored elements; refuse a split inside a packed element."""
        if value % pack:
            raise PackedSplitError(
                f"{self._what(shard_id)}: the {role} {value} of this rank's part (in output features) is not "
                f"a multiple of the pack factor {pack}, so the part would start or end inside a packed "
                f"element (tensor parallel size {self.tp_size})"
            )
        return value // pack

    def shard_slice(
        self, layout: ParamLayout, shape: Sequence[int], loaded: CheckpointTensor, shard_id: ShardId = None
    ) -> tuple[CheckpointTensor, int, int]:
        """This rank's piece of ``loaded`` and where it lands in a parameter of ``layout`` and ``shape``.

        ``shape`` is the parameter's shape as the split sees it
        (:func:`~loader.layers.param_layout.param_shape`). Returns
        ``(narrowed, offset, size)``: ``narrowed`` is ``loaded`` narrowed
        (nothing read) to the rows of part ``shard_id`` this rank owns (and,
        for a row-parallel layer, to its input columns); ``offset`` and
        ``size`` are the destination rows along ``layout.output_dim``. For a
        layout without ``output_dim`` (a per-tensor scale) ``loaded`` comes
        back whole with ``(0, len)`` covering the parameter.
        Raises :class:`~loader.errors.ShapeMismatchError` when ``loaded`` does
        not have the full (unsharded) shape the part needs, and
        :class:`~loader.errors.PackedSplitError` when the part's rows do not
        fall on whole packed elements.
        """
        part = self.narrow_part(layout, shape, loaded, shard_id)
        return part.narrowed, part.offset, part.size

    def narrow_part(
        self, layout: ParamLayout, shape: Sequence[int], loaded: CheckpointTensor, shard_id: ShardId = None
    ) -> NarrowedPart:
        """:meth:`shard_slice` with where the piece sits in ``loaded`` too (what ``load_part`` receives)."""
        output_dim = layout.output_dim
        input_dim = layout.input_dim if self._splits_input else None
        expected = list(shape)
        offset, size = 0, (int(shape[0]) if shape else 1)
        start = length = 0
        if output_dim is not None:
            part = self._output_part(shard_id)
            pack = layout.pack_along(output_dim)
            start = self._packed(part.start, pack, "first row", shard_id)
            length = self._packed(part.length, pack, "row count", shard_id)
            offset = self._packed(part.offset, pack, "destination row", shard_id)
            size = length
            expected[output_dim] = self._packed(part.full, pack, "full row count", shard_id)
        per_rank = 0
        if input_dim is not None:
            per_rank = int(shape[input_dim])
            expected[input_dim] = per_rank * self.tp_size
        check_shape(loaded, expected, self._what(shard_id))
        narrowed = loaded
        rows = cols = None
        if output_dim is not None:
            narrowed = narrowed.narrow(output_dim, start, length)
            rows = (start, length)
        if input_dim is not None:
            narrowed = narrowed.narrow(input_dim, self.tp_rank * per_rank, per_rank)
            cols = (self.tp_rank * per_rank, per_rank)
        return NarrowedPart(shard_id, narrowed, loaded, offset, size, rows, cols)

    def weight_loader(self, param: torch.Tensor, loaded: CheckpointTensor, shard_id: ShardId = None) -> None:
        """Read this rank's shard of ``loaded`` into ``param`` (part ``shard_id`` of a fused layer).

        A fused layer given ``shard_id=None`` takes a checkpoint tensor that is
        already fused (q, k and v stacked) and loads each part in turn. A
        layout with its own ``load_part`` (a quantize method that quantizes
        while loading) receives each narrowed part instead of a copy.
        """
        layout = layout_of(param)
        output_dim = layout.output_dim
        shape = param_shape(param, layout)
        if shard_id is None and output_dim is not None and self._shard_ids() != [None]:
            self._load_fused(param, layout, shape, loaded)
            return
        if layout.load_part is not None:
            layout.load_part(param, self.narrow_part(layout, shape, loaded, shard_id))
            return
        narrowed, offset, size = self.shard_slice(layout, shape, loaded, shard_id)
        destination = param.data if output_dim is None else param.data.narrow(output_dim, offset, size)
        check_shape(narrowed, destination.shape, self.display_name)
        # only the largest part (q of q/k/v) decides where a mapped parameter lies: the others may sit in the
        # file at another page phase, and placing the region for them would copy the large part instead
        largest = max(self._output_part(sid).length for sid in self._shard_ids())
        fill_parameter(param, narrowed, output_dim, offset,
                       may_place=shard_id is None or self._output_part(shard_id).length == largest)

    def _load_fused(self, param: torch.Tensor, layout: ParamLayout, shape: Sequence[int],
                    loaded: CheckpointTensor) -> None:
        assert layout.output_dim is not None
        output_dim = layout.output_dim
        pack = layout.pack_along(output_dim)
        fulls = [self._packed(self._output_part(sid).full, pack, "full row count", sid)
                 for sid in self._shard_ids()]
        expected = list(shape)
        expected[output_dim] = sum(fulls)
        if self._splits_input and layout.input_dim is not None:
            expected[layout.input_dim] *= self.tp_size
        check_shape(loaded, expected, f"{self.display_name} (fused)")
        start = 0
        for sid, full in zip(self._shard_ids(), fulls, strict=True):
            self.weight_loader(param, loaded.narrow(output_dim, start, full), sid)
            start += full
