"""A layer's kernel record as tensors a packed-weights bundle can hold, and back.

A kernel (:class:`~loader_plugin_marlin.kernels.LayerKernel`) is a frozen ``attrs`` record of tensors, plain
values and nested records (the int4 kernel's :class:`~loader.kernels.Int4CpuWeight` and
:class:`~loader.kernels.KernelChoice`). :func:`kernel_unit` writes it as its tensors (``t0``, ``t1``, ...) plus
``form``: the record's shape as JSON in a uint8 tensor (each record's class, each field's value, a tensor's name,
dtype and shape). :func:`kernel_from_unit` builds the record again around the tensors the bundle maps, after
checking that every tensor is the one the form names. Only records of this plugin and of ``loader.kernels`` are
built again; a kernel holding anything else is not kept (:func:`kernel_unit` answers ``None``).
"""

from __future__ import annotations

import importlib
import json
from typing import Any

import attrs
import torch

__all__ = ["FORM", "kernel_from_unit", "kernel_unit"]

FORM = "form"
"""The unit's tensor holding the record's form."""
_MODULES = ("loader_plugin_marlin.", "loader.kernels.")
_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.uint8, torch.int8, torch.int32, torch.int64,
                                                      torch.float32, torch.float16, torch.bfloat16)}


class _NotKept(Exception):
    """A value the bundle cannot hold (or a form that does not describe the unit)."""


def kernel_unit(kernel: object) -> dict[str, torch.Tensor] | None:
    """``kernel``'s tensors and its form, or ``None`` when it holds a value this module does not write."""
    tensors: dict[str, torch.Tensor] = {}
    try:
        form = _encode(kernel, tensors)
    except _NotKept:
        return None
    tensors[FORM] = torch.frombuffer(bytearray(json.dumps(form).encode()), dtype=torch.uint8)
    return tensors


def kernel_from_unit(unit: dict[str, torch.Tensor]) -> Any | None:
    """The record :func:`kernel_unit` wrote, around ``unit``'s tensors; ``None`` when the form does not
    describe them (another plugin version's classes, a damaged unit)."""
    form_bytes = unit.get(FORM)
    if form_bytes is None:
        return None
    try:
        form = json.loads(form_bytes.numpy().tobytes())
        used: set[str] = set()
        kernel = _decode(form, unit, used)
    except (_NotKept, ValueError, TypeError, KeyError, AttributeError, ImportError):
        return None
    return kernel if used == set(unit) - {FORM} else None


def _encode(value: object, tensors: dict[str, torch.Tensor]) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, torch.Tensor):
        if value.dtype not in _DTYPES.values() or value.device.type != "cpu":
            raise _NotKept
        name = f"t{len(tensors)}"
        tensors[name] = value
        return {"tensor": name, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if isinstance(value, torch.dtype):
        if value not in _DTYPES.values():
            raise _NotKept
        return {"torch_dtype": str(value).removeprefix("torch.")}
    if isinstance(value, tuple):
        return {"tuple": [_encode(item, tensors) for item in value]}
    cls = type(value)
    if attrs.has(cls) and cls.__module__.startswith(_MODULES):
        fields = {field.alias: _encode(getattr(value, field.name), tensors)
                  for field in attrs.fields(cls) if field.init}
        return {"record": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}
    raise _NotKept


def _decode(form: object, unit: dict[str, torch.Tensor], used: set[str]) -> object:
    if form is None or isinstance(form, (bool, int, float, str)):
        return form
    if not isinstance(form, dict):
        raise _NotKept
    if "tensor" in form:
        tensor = unit[form["tensor"]]
        if tensor.dtype != _DTYPES[form["dtype"]] or list(tensor.shape) != form["shape"]:
            raise _NotKept
        used.add(form["tensor"])
        return tensor
    if "torch_dtype" in form:
        return _DTYPES[form["torch_dtype"]]
    if "tuple" in form:
        return tuple(_decode(item, unit, used) for item in form["tuple"])
    module, _, qualname = str(form["record"]).partition(":")
    if not module.startswith(_MODULES):
        raise _NotKept
    found: object = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, type) or not attrs.has(found):
        raise _NotKept
    cls = found
    return cls(**{name: _decode(value, unit, used) for name, value in form["fields"].items()})
