"""What a parameter's dimensions mean, as one typed record per parameter.

A layer (or a quantize method) creates a parameter and says, once, how
checkpoint tensors land in it: which dimension holds output features and
which input features (the tensor-parallel split follows them), whether one
stored element packs several logical values along a dimension, and which
``weight_loader`` fills it. vLLM keeps these facts as loose attributes on
the tensor (``param.output_dim``), read back with ``getattr`` and a default;
a typo there is a silently wrong split. Here they are one frozen
:class:`ParamLayout`, attached with :func:`set_param_layout` and read with
:func:`layout_of` / :func:`weight_loader_of`, so every reader sees the
same typed record. The record survives materialization (the pipeline moves
a parameter's attributes to its real storage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch

    from .shard_loading import NarrowedPart

__all__ = [
    "PartLoader",
    "ParamLayout",
    "WeightLoader",
    "layout_of",
    "param_shape",
    "set_param_layout",
    "weight_loader_of",
]

WeightLoader = Callable[..., None]
"""``weight_loader(param, checkpoint_tensor, shard_id=None)``: fills ``param`` from one checkpoint tensor."""

PartLoader = Callable[["torch.Tensor", "NarrowedPart"], None]
"""``load_part(param, part)``: lands one part, already narrowed to this rank.

``part`` (:class:`~loader.layers.shard_loading.NarrowedPart`) holds the
narrowed checkpoint tensor, the part's whole tensor, and the destination rows
along ``output_dim`` in logical units (the parameter's :func:`param_shape`)."""

_ATTRIBUTE = "_loader_layout"


@attrs.frozen
class ParamLayout:
    """How checkpoint tensors map onto one parameter.

    :ivar weight_loader: the loader model code calls for this parameter
        (``None``: the core's ``default_weight_loader``, a whole-tensor copy).
    :ivar output_dim: the dimension holding output features, split over
        ranks by column-parallel layers and stacked by fused ones; ``None``
        for a per-tensor value (a scale), which is copied whole.
    :ivar input_dim: the dimension holding input features, split over ranks
        by row-parallel layers.
    :ivar packed_dim: the dimension along which one stored element holds
        ``pack_factor`` logical values (GPTQ's eight 4-bit codes per int32).
    :ivar pack_factor: logical values per stored element along ``packed_dim``.
    :ivar logical_shape: the shape the layer's arithmetic sees, when it
        differs from the stored one (bitsandbytes keeps ``(rows, cols)``
        codes as a flat byte vector); ``None``: the parameter's own shape.
    :ivar load_part: a quantize method's own landing step for parameters
        that are not a plain copy of the narrowed rows (quantize on the fly):
        the layer still splits fused tensors, checks shapes and narrows to
        this rank, then hands each part here instead of copying it.
    """

    weight_loader: WeightLoader | None = None
    output_dim: int | None = None
    input_dim: int | None = None
    packed_dim: int | None = None
    pack_factor: int = attrs.field(default=1)
    logical_shape: tuple[int, ...] | None = None
    load_part: PartLoader | None = None

    @pack_factor.validator
    def _check_pack_factor(self, attribute: Any, value: int) -> None:
        if value < 1:
            raise ValueError(f"pack_factor must be a positive integer, got {value!r}")

    def pack_along(self, dim: int) -> int:
        """How many logical values one stored element holds along ``dim`` (1 unless packed there)."""
        return self.pack_factor if self.packed_dim == dim else 1


_NO_LAYOUT = ParamLayout()


def set_param_layout(param: torch.Tensor, layout: ParamLayout) -> None:
    """Attach ``layout`` to ``param`` (replacing any earlier one)."""
    setattr(param, _ATTRIBUTE, layout)


def layout_of(param: torch.Tensor) -> ParamLayout:
    """``param``'s layout; a parameter nobody described is a whole tensor with the default loader."""
    layout = param.__dict__.get(_ATTRIBUTE)
    if layout is None:
        return _NO_LAYOUT
    if not isinstance(layout, ParamLayout):
        raise TypeError(f"parameter layout must be a ParamLayout, found {type(layout).__name__}")
    return layout


def param_shape(param: torch.Tensor, layout: ParamLayout | None = None) -> tuple[int, ...]:
    """The shape the layer's split arithmetic uses: the layout's logical shape, else the stored one."""
    layout = layout_of(param) if layout is None else layout
    return layout.logical_shape if layout.logical_shape is not None else tuple(param.shape)


def weight_loader_of(param: torch.Tensor) -> WeightLoader:
    """The loader that fills ``param`` from a checkpoint tensor (``default_weight_loader`` if none is set)."""
    loader = layout_of(param).weight_loader
    if loader is not None:
        return loader
    from .default_loader import default_weight_loader  # torch's copy_: reading a layout imports no torch

    return default_weight_loader
