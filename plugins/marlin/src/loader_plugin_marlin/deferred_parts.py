"""A weight's kernel from the packed-weights bundle when an earlier load packed it, its tensors read only if not.

Why: a load that finds a layer's kernel in the bundle (:mod:`.packed_cache`) never needs the checkpoint's
quantized tensors, and reading them (into fresh parameter memory, or mapping them) was most of what remained of
such a load. So while a load with a bundle lands weights, each part of a ``copy`` tensor (``qweight``,
``scales``, ...) is only remembered (:class:`DeferredParts`: the layer's own loader has still split fused
tensors, checked shapes and narrowed to this rank); the small tensors (``g_idx``, shape records, per-tensor
scales) are read as always. After loading, :func:`cached_kernel` keys the weight by what it was given, takes
the kernel from the bundle, or lands the remembered parts as the layer's loader would have (mapped from the file
where it can be) and builds the kernel (:func:`~.word_packing.layer_kernel`), stored for the bundle.

A live weight update never defers: it lands its tensors as they come and repacks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import attrs
import torch

from loader.layers import layout_of
from loader.models import current_session
from loader.weights import fill_parameter

from .kernel_paths import with_paths
from .kernel_records import kernel_from_unit, kernel_unit
from .packed_cache import unit_key
from .word_packing import layer_kernel

if TYPE_CHECKING:
    from loader.layers import NarrowedPart

    from .config import PackedQuantConfig
    from .kernels import LayerKernel
    from .layer_geometry import LayerGeometry

__all__ = ["DeferredParts", "cached_kernel", "defers_reads", "release_scratch"]


@attrs.define
class DeferredParts:
    """The parts of a layer's ``copy`` tensors remembered while loading, by parameter name (landed later)."""

    parts: dict[str, list[NarrowedPart]] = attrs.field(factory=dict)
    borrowed: list[torch.Tensor] = attrs.field(factory=list)
    """Scratch buffers :meth:`land_aside` took, handed back by :meth:`give_back`."""

    def remember(self, name: str, param: torch.Tensor, part: NarrowedPart) -> None:
        """A ``load_part``: keep ``part`` of parameter ``name`` (nothing read)."""
        self.parts.setdefault(name, []).append(part)

    def of_expert(self, names: Mapping[str, str], expert: int) -> dict[str, list[NarrowedPart]]:
        """The parts of one local expert, by checkpoint tensor name (``names``: parameter -> tensor name)."""
        return {tensor: [p for p in self.parts.get(param, []) if p.expert == expert] for param, tensor in names.items()}

    def land(self, name: str, param: torch.Tensor, parts: list[NarrowedPart] | None = None) -> None:
        """Write the remembered parts of ``name`` (or ``parts`` of it) into ``param`` as its loader would have:
        the largest first, so that it decides where a mapped parameter lies."""
        layout = layout_of(param)
        pending = self.parts.get(name, []) if parts is None else parts
        for part in sorted(pending, key=lambda p: -p.size):
            dim = layout.output_dim if part.expert is None or layout.output_dim is None else layout.output_dim - 1
            fill_parameter(param, part.narrowed, locate=_rows_of(part, dim))
        for part in pending:
            self.parts[name].remove(part)

    def land_aside(self, name: str, param: torch.Tensor, parts: list[NarrowedPart] | None = None,
                   expert: int | None = None) -> torch.Tensor:
        """The remembered parts of ``name`` (or ``parts`` of it) read into a scratch buffer shaped as ``param``
        (as ``param[expert]``), not into ``param``: for a tensor the kernel only reads while it is built.

        Why: a parameter's pages are fresh memory, whose first touch costs more than the read itself on a VM
        that hands freed memory back to its host; the scratch buffers are reused from layer to layer (and
        handed back with :meth:`give_back`), so a load touches fresh memory for the largest layer only."""
        layout = layout_of(param)
        shape = tuple(param.shape if expert is None else param.shape[1:])
        dim = layout.output_dim if expert is None or layout.output_dim is None else layout.output_dim - 1
        numel = 1
        for size in shape:
            numel *= size
        buffer = _take_scratch(numel * param.element_size())
        self.borrowed.append(buffer)
        target = buffer[:numel * param.element_size()].view(param.dtype).view(shape)
        pending = self.parts.get(name, []) if parts is None else parts
        for part in pending:
            part.narrowed.read_into(target if dim is None else target.narrow(dim, part.offset, part.size))
        for part in list(pending):
            self.parts[name].remove(part)
        return target

    def give_back(self) -> None:
        """Hand the scratch buffers back for the next layer (the kernel built from them holds none of them)."""
        with _SPARE_LOCK:
            _SPARE.extend(self.borrowed)
        self.borrowed.clear()


_SPARE: list[torch.Tensor] = []
_SPARE_LOCK = threading.Lock()


def _take_scratch(nbytes: int) -> torch.Tensor:
    """A spare uint8 buffer of at least ``nbytes`` (the smallest that fits), else a new one."""
    with _SPARE_LOCK:
        fitting = [i for i, buffer in enumerate(_SPARE) if buffer.numel() >= nbytes]
        if fitting:
            return _SPARE.pop(min(fitting, key=lambda i: _SPARE[i].numel()))
    return torch.empty(nbytes, dtype=torch.uint8)


def release_scratch() -> None:
    """Free the spare buffers (after a load's layers are processed)."""
    with _SPARE_LOCK:
        _SPARE.clear()


def defers_reads(config: PackedQuantConfig) -> bool:
    """Whether a layer being built for this load remembers its ``copy`` tensors' parts instead of reading them:
    on the CPU (the bundle may hold the layer's kernel; if not, the word tensor is read into reused scratch)."""
    return current_session().device.type == "cpu"


def _rows_of(part: NarrowedPart, dim: int | None) -> Callable[[torch.Tensor], torch.Tensor]:
    """Where ``part`` lands in a parameter's data: its expert's slice, its rows along ``dim``."""
    def where(data: torch.Tensor) -> torch.Tensor:
        target = data if part.expert is None else data[part.expert]
        return target if dim is None else target.narrow(dim, part.offset, part.size)
    return where


def cached_kernel(config: PackedQuantConfig, geometry: LayerGeometry, dtype: torch.dtype, *, method: str,
                  deferred: Mapping[str, list[NarrowedPart]], values: Mapping[str, torch.Tensor],
                  tensors: Callable[[], Mapping[str, torch.Tensor]]) -> LayerKernel:
    """One weight's kernel: from the load's bundle when it holds the unit this weight's key names, else built
    from ``tensors()`` (which lands the deferred parts first) and stored for the bundle.

    :param method: what converts the weight (the quantize method's class), part of the key.
    :param deferred: the weight's remembered parts, by checkpoint tensor name (empty: nothing was deferred,
        and nothing is cached).
    :param values: the weight's tensors read while loading, by name (their values are keyed).
    """
    bundle = config.packed_cache.open() if deferred else None
    key = None
    if bundle is not None:
        what = {"method": method, "config": repr(config), "geometry": repr(geometry), "dtype": str(dtype)}
        key = unit_key(what, deferred, values, bundle.files)
    if bundle is not None and key is not None:
        found = bundle.lookup(key, None)
        kernel = kernel_from_unit(found) if found is not None else None
        if kernel is not None:  # planned again: the timings, LOADER_KERNEL_MEASURE and the dense budget are now's
            return with_paths(kernel, dtype, exact=config.exact_float32, budget=config.dense_budget)
    kernel = layer_kernel(config, geometry, tensors(), dtype)
    if bundle is not None and key is not None and getattr(kernel, "dense", None) is None:  # no dense copy kept
        unit = kernel_unit(kernel)
        if unit is not None:
            bundle.store(key, unit)
    return kernel
