"""One weight's checkpoint tensors → its kernel, and the kernel's tensors kept as the owning layer's buffers.

A linear layer holds one weight; a fused-experts layer holds two per expert
(gate/up and down). Both convert each weight the same way
(:func:`build_kernel`: the int4 kernel a slice of columns at a time for wide
weights, else :func:`~loader_plugin_marlin.kernels.choose_kernel` on the whole
:class:`~loader_plugin_marlin.quantized_weight.QuantizedWeight`) and keep the
kernel's tensors as buffers of the layer, so ``model.to(...)``, ``state_dict``
and the device move of post-processing see them. A kernel is a frozen record;
after the layer is moved, :func:`with_layer_buffers` rebuilds it around the
layer's current buffers so it never computes with (or keeps alive) the old ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs
import torch

from loader.errors import UnsupportedError
from loader.kernels import KernelChoice, paths_from_shapes
from loader.models import current_session

from .column_chunks import int4_by_columns
from .kernel_paths import PATH_KERNELS, kernel_dtype_for, with_paths
from .kernels import LayerKernel, choose_kernel, plan_kernel

if TYPE_CHECKING:
    from torch import nn

    from .config import PackedQuantConfig
    from .layer_geometry import LayerGeometry

__all__ = ["BUFFER_PREFIX", "build_kernel", "combined_choice", "kernel_tensors", "plan_weight", "refill_kernel_buffers",
           "register_kernel_buffers", "with_layer_buffers"]

BUFFER_PREFIX = "packed_"


def build_kernel(config: PackedQuantConfig, geometry: LayerGeometry, tensors: Mapping[str, torch.Tensor],
                 dtype: torch.dtype) -> LayerKernel:
    """The kernel of one weight from its checkpoint tensors (named as the format's ``ParamSpec``s), checked,
    packed in :func:`~.kernel_paths.kernel_dtype_for` the load's ``dtype``, with its path per token count."""
    layout = config.layout
    packed_dtype = kernel_dtype_for(dtype, config.exact_float32)
    kernel: LayerKernel | None = int4_by_columns(layout, geometry, tensors, bits=config.bits,
                                                 requested=config.kernel, dtype=packed_dtype)
    if kernel is None:
        kernel = choose_kernel(layout.to_quantized(tensors, geometry), config.kernel, packed_dtype)
    return with_paths(kernel, dtype, exact=config.exact_float32, budget=config.dense_budget)


def plan_weight(config: PackedQuantConfig, geometry: LayerGeometry, device: torch.device) -> KernelChoice:
    """The kernel :func:`build_kernel` will choose for a weight of this geometry on ``device``, from shapes."""
    dtype = current_session().dtype
    packed_dtype = kernel_dtype_for(dtype, config.exact_float32)
    choice = plan_kernel(geometry, bits=config.bits, group_size=config.group_size, act_order=config.act_order,
                         requested=config.kernel, device=device, dtype=packed_dtype)
    if choice.kernel not in PATH_KERNELS or device.type != "cpu":
        return choice
    return attrs.evolve(choice, paths=paths_from_shapes(dtype, packed_dtype, exact=config.exact_float32))


def combined_choice(choices: Iterable[KernelChoice]) -> KernelChoice:
    """One record for a layer whose weights got these kernels: the distinct kernels joined by ``+`` (the
    :class:`~loader.kernels.KernelChoice` convention), the distinct reasons joined by ``; ``."""
    unique = list(dict.fromkeys(choices))
    if len(unique) == 1:
        return unique[0]
    kernels = "+".join(dict.fromkeys(choice.kernel for choice in unique))
    reasons = list(dict.fromkeys(choice.reason for choice in unique if choice.reason))
    return KernelChoice(kernels, "; ".join(reasons) or None)


def kernel_tensors(kernel: object, _nested: str = "") -> list[tuple[str, torch.Tensor]]:
    """Every tensor a kernel record holds (one level of nested records), named by field, for the layer's buffers."""
    found: list[tuple[str, torch.Tensor]] = []
    for field in attrs.fields(cast(Any, type(kernel))):
        value = getattr(kernel, field.name)
        if isinstance(value, torch.Tensor):
            found.append((f"{_nested}{field.name}", value))
        elif attrs.has(type(value)) and not _nested:
            found += kernel_tensors(value, f"{field.name}_")
    return found


def register_kernel_buffers(layer: nn.Module, kernel: object, prefix: str = BUFFER_PREFIX) -> None:
    """Keep ``kernel``'s tensors as ``layer``'s buffers named ``prefix`` + field (see :func:`with_layer_buffers`)."""
    for name, tensor in kernel_tensors(kernel):
        layer.register_buffer(f"{prefix}{name}", tensor)


def _kernel_form(kernel: object) -> list[tuple[str, object]]:
    """What a kernel record is apart from its tensors' values: each field's value, or a tensor's shape and dtype."""
    form: list[tuple[str, object]] = []
    for field in attrs.fields(cast(Any, type(kernel))):
        value = getattr(kernel, field.name)
        if isinstance(value, torch.Tensor):
            form.append((field.name, (tuple(value.shape), value.dtype)))
        elif attrs.has(type(value)):
            form += [(f"{field.name}_{name}", nested) for name, nested in _kernel_form(value)]
        else:
            form.append((field.name, value))
    return form


def refill_kernel_buffers(layer: nn.Module, current: object, new: object, prefix: str = BUFFER_PREFIX) -> None:
    """Copy kernel ``new``'s tensors into ``layer``'s buffers of kernel ``current``, in place (same storage).

    The two must be the same kernel with tensors of the same shapes and dtypes, which new checkpoint tensors of
    the same geometry give unless they change what the kernel depends on (an activation order where there was
    none); otherwise a :class:`~loader.errors.UnsupportedError` names what differs and nothing is copied.
    """
    old_form, new_form = dict(_kernel_form(current)), dict(_kernel_form(new))
    differ = [name for name in old_form if old_form[name] != new_form.get(name)]
    if differ:
        shown = "; ".join(f"{name}: {old_form[name]} -> {new_form.get(name)}" for name in differ)
        raise UnsupportedError(f"the new tensors need a kernel laid out differently from the one the layer runs "
                               f"({shown}); load the new checkpoint with loader.load_model")
    for name, tensor in kernel_tensors(new):
        layer.get_buffer(f"{prefix}{name}").copy_(tensor)


def with_layer_buffers(kernel: Any, layer: nn.Module, prefix: str = BUFFER_PREFIX, _nested: str = "") -> Any:
    """``kernel`` (or a nested record of it) with each tensor replaced by the layer's buffer of that name, when
    the two differ (the layer was moved); the same object when nothing changed."""
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(kernel)):
        value = getattr(kernel, field.name)
        if isinstance(value, torch.Tensor):
            current = layer.get_buffer(f"{prefix}{_nested}{field.name}")
            if current is not value:
                changes[field.alias] = current
        elif attrs.has(type(value)) and not _nested:
            nested = with_layer_buffers(value, layer, prefix, f"{field.name}_")
            if nested is not value:
                changes[field.alias] = nested
    return attrs.evolve(kernel, **changes) if changes else kernel
