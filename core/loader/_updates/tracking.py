"""What an update writes: every parameter's weight loader watched for the length of one update.

The model's own ``load_weights`` maps checkpoint names to parameters and calls
each parameter's weight loader (:func:`~loader.layers.weight_loader_of`, or a
``weight_loader`` attribute in vLLM's style). For the update, each loader is
wrapped, so that before the first write into a parameter the quantize method
of its layer is asked whether it can take new tensors in place
(:meth:`~loader.layers.QuantizeMethodBase.weight_update_refusal`), a probe
that reaches a write stops there (:class:`~.update_tensor.ProbeReached`), and
the parameters written are known: the report lists them and only their layers
are post-processed again. The original loaders are put back when the update ends.

A quantize method that repacked its layer's checkpoint tensors into buffers of
its own gets the layer back with parameters for them first
(:meth:`~loader.layers.QuantizeMethodBase.open_for_update`): the layers the
update's names point to when they are known, else every quantized layer.

Every parameter must keep its storage (optimizers, CUDA graphs and views hold
it): the storage addresses taken before the update are checked after it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

import attrs
import torch
from torch import nn

from ..errors import LoadError, PluginError, UnsupportedError
from ..layers.param_layout import ParamLayout, layout_of, set_param_layout, weight_loader_of
from ..layers.quantization import QuantizeMethodBase
from .update_tensor import ProbeReached

__all__ = ["WriteTracker", "check_storage_kept", "check_written_layers", "layers_named", "refusing_layer", "reprocess",
           "storage_addresses", "tracked_writes"]

_LAYOUT = "_loader_layout"
_ATTRIBUTE = "weight_loader"


@attrs.define
class WriteTracker:
    """The parameters an update has touched, and the layers they belong to.

    :ivar names: each parameter's first name in ``model.named_parameters()``.
    :ivar owners: for a parameter of a quantized layer, ``(layer prefix, layer, its quantize method)``.
    :ivar touched: the parameters written (or, in a probe, about to be), by ``id``.
    """

    names: dict[int, str]
    owners: dict[int, tuple[str, nn.Module, QuantizeMethodBase]]
    touched: dict[int, torch.Tensor] = attrs.field(factory=dict)
    opened: list[tuple[str, nn.Module, QuantizeMethodBase]] = attrs.field(factory=list)

    @classmethod
    def of(cls, model: nn.Module) -> WriteTracker:
        names: dict[int, str] = {}
        for name, param in model.named_parameters():
            names.setdefault(id(param), name)
        owners: dict[int, tuple[str, nn.Module, QuantizeMethodBase]] = {}
        for prefix, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if isinstance(method, QuantizeMethodBase):
                for param in module.parameters(recurse=False):
                    owners.setdefault(id(param), (prefix, module, method))
        return cls(names, owners)

    def admit(self, param: torch.Tensor) -> None:
        """Record ``param`` as written; refuse it by name first when its layer's method cannot take new tensors."""
        key = id(param)
        if key in self.touched:
            return
        owner = self.owners.get(key)
        if owner is not None:
            prefix, module, method = owner
            reason = method.weight_update_refusal(module)
            if reason is not None:
                raise UnsupportedError(f"parameter {self.names.get(key, '?')!r} of layer {prefix!r} cannot be "
                                       f"updated in place: {reason}")
        self.touched[key] = param

    def touched_names(self) -> tuple[str, ...]:
        return tuple(sorted(self.names.get(key, "?") for key in self.touched))

    def touched_layers(self) -> list[tuple[str, nn.Module, QuantizeMethodBase]]:
        """The quantized layers a written parameter belongs to, each once, in model order."""
        seen: dict[int, tuple[str, nn.Module, QuantizeMethodBase]] = {}
        for key in self.touched:
            owner = self.owners.get(key)
            if owner is not None:
                seen.setdefault(id(owner[1]), owner)
        return sorted(seen.values(), key=lambda owner: owner[0])

    def forget(self) -> None:
        """Forget a probe pass: no parameter written, and each opened layer's record of parts cleared."""
        self.touched.clear()
        for _, module, method in self.opened:
            method.open_for_update(module)


def _watching(tracker: WriteTracker, original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def watched(param: torch.Tensor, loaded: Any, *args: Any, **kwargs: Any) -> None:
        tracker.admit(param)
        with contextlib.suppress(ProbeReached):  # a probe got as far as the write: every check before it passed
            original(param, loaded, *args, **kwargs)

    return watched


def _quantized_layers(model: nn.Module) -> dict[str, tuple[nn.Module, QuantizeMethodBase]]:
    found = {}
    for prefix, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if isinstance(method, QuantizeMethodBase):
            found[prefix] = (module, method)
    return found


def _candidate_layers(model: nn.Module, name: str) -> list[str]:
    """The layers checkpoint tensor ``name`` may land in: each enclosing prefix (``...mlp.down_proj``,
    ``...mlp.experts``), and the fused layer of its own (``qkv_proj`` for ``q_proj``)."""
    prefix, _, _ = name.rpartition(".")
    head, _, leaf = prefix.rpartition(".")
    fused = getattr(type(model), "packed_modules_mapping", {})
    candidates = [f"{head}.{whole}" if head else whole for whole, parts in fused.items() if leaf in parts]
    while prefix:
        candidates.append(prefix)
        prefix = prefix.rpartition(".")[0]
    return candidates


def layers_named(model: nn.Module, names: Collection[str] | None) -> list[tuple[str, nn.Module, QuantizeMethodBase]]:
    """The quantized layers an update of ``names`` may write, in model order: every quantized layer for ``None``,
    or when a name is under no module of the model (the model's ``load_weights`` renames it)."""
    layers = _quantized_layers(model)
    modules = {prefix for prefix, _ in model.named_modules()}
    candidates = {name: _candidate_layers(model, name) for name in names} if names is not None else {}
    if names is None or any(not any(c in modules for c in found) for found in candidates.values()):
        return [(prefix, module, method) for prefix, (module, method) in layers.items()]
    wanted = {candidate for found in candidates.values() for candidate in found if candidate in layers}
    return [(prefix, module, method) for prefix, (module, method) in layers.items() if prefix in wanted]


@contextmanager
def tracked_writes(model: nn.Module, names: Collection[str] | None = None) -> Iterator[WriteTracker]:
    """Wrap every parameter's weight loader for the block; the originals are restored however it ends.

    The quantized layers ``names`` may write (all of them when ``None``: the names are not known up front) are
    opened for the update first and closed after it.
    """
    opened: list[tuple[str, nn.Module, QuantizeMethodBase]] = []
    restore: list[tuple[torch.Tensor, str, Any]] = []
    seen: set[int] = set()
    try:
        for prefix, module, method in layers_named(model, names):
            opened.append((prefix, module, method))
            method.open_for_update(module)
        tracker = WriteTracker.of(model)
        tracker.opened = opened
        for param in model.parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            restore.append((param, _LAYOUT, param.__dict__.get(_LAYOUT)))
            layout: ParamLayout = layout_of(param)
            set_param_layout(param, attrs.evolve(layout, weight_loader=_watching(tracker, weight_loader_of(param))))
            if callable(param.__dict__.get(_ATTRIBUTE)):
                restore.append((param, _ATTRIBUTE, param.__dict__[_ATTRIBUTE]))
                param.__dict__[_ATTRIBUTE] = _watching(tracker, param.__dict__[_ATTRIBUTE])
        yield tracker
    finally:
        for param, attribute, value in reversed(restore):
            if value is None:
                param.__dict__.pop(attribute, None)
            else:
                param.__dict__[attribute] = value
        for _, module, method in opened:
            method.close_update(module)


def storage_addresses(model: nn.Module) -> dict[str, int]:
    """Every parameter's storage address, by name, to check afterwards that an update kept it."""
    return {name: param.data_ptr() for name, param in model.named_parameters()}


def check_storage_kept(model: nn.Module, before: dict[str, int]) -> None:
    """Raise :class:`~loader.errors.PluginError` naming the parameters whose storage an update replaced."""
    moved = [name for name, param in model.named_parameters() if before.get(name) != param.data_ptr()]
    if moved:
        shown = ", ".join(moved[:10]) + (f", ... ({len(moved)} in all)" if len(moved) > 10 else "")
        raise PluginError(f"the update replaced the storage of parameter(s) {shown} instead of writing into it "
                          "(a weight loader or a quantize method assigned param.data)")


def check_written_layers(tracker: WriteTracker) -> None:
    """Ask each written quantized layer whether what it was given can be converted on its own (a packed layer
    needs its whole tensor set); the first that cannot raises, naming what is missing."""
    for _, module, method in tracker.touched_layers():
        method.check_update(module)


def reprocess(tracker: WriteTracker, *, after_error: bool = False) -> tuple[str, ...]:
    """Run each written quantized layer's post-processing again (a repack, a code table); return their prefixes.

    Every layer is checked first (:func:`check_written_layers`), so none is converted when one cannot be. After
    an update's error (``after_error``), a layer that cannot be converted is passed over instead: it keeps its
    weights as they were.
    """
    if not after_error:
        check_written_layers(tracker)
    done = []
    with torch.no_grad():
        for prefix, module, method in tracker.touched_layers():
            if after_error:
                try:
                    method.check_update(module)
                except LoadError:
                    continue
            method.process_weights_after_loading(module)
            done.append(prefix)
    return tuple(done)


def refusing_layer(model: nn.Module, name: str) -> UnsupportedError | None:
    """The error for checkpoint tensor ``name`` when the model has no parameter for it but a quantized layer
    it belongs to is known: a method that refuses updates says why; one that takes them names what it takes.

    A method that repacks into buffers of its own (GGUF blocks kept packed) leaves the layer no parameter for
    the checkpoint name, so the model's ``load_weights`` finds none; the layer is found here by the name's
    prefix (``...mlp.down_proj``), or its fused layer's (``q_proj`` in ``qkv_proj``).
    """
    layers = _quantized_layers(model)
    for candidate in _candidate_layers(model, name):
        if candidate not in layers:
            continue
        module, method = layers[candidate]
        reason = method.weight_update_refusal(module)
        if reason is not None:
            return UnsupportedError(f"tensor {name!r} of the update is for layer {candidate!r}, which cannot be "
                                    f"updated in place: {reason}")
        takes = [leaf for leaf, _ in module.named_parameters(recurse=False)]
        if name.rpartition(".")[2] not in takes:
            return UnsupportedError(
                f"tensor {name!r} of the update is for layer {candidate!r}, which its quantize method "
                f"{type(method).__name__} keeps as {', '.join(takes) or 'buffers of its own'}: give the layer "
                f"tensors in that format (as its checkpoint holds them), not {name.rpartition('.')[2]!r}")
        return None
    return None
