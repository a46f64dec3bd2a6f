"""What a registered model class can do, read from the class without building it.

:class:`ModelInfo` is computed from class attributes and the capability mixins
of :mod:`loader._interfaces`; nothing is instantiated and no tensor is made, so
it can run in the probe child (which must not touch CUDA) as well as in a
process that already imported the class. It travels between the two as JSON,
and is cached on disk in that form.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

__all__ = ["ModelInfo", "ModelInfoError", "inspect_model_class"]

PackedModules = tuple[tuple[str, tuple[str, ...]], ...]


class ModelInfoError(ValueError):
    """A class declares a capability attribute of the wrong shape (reported by the probe)."""


def _packed_modules(value: Mapping[str, Iterable[str]] | Iterable[Any]) -> PackedModules:
    """Freeze ``{"qkv_proj": ["q_proj", ...]}`` into sorted pairs of tuples, so the record hashes."""
    items: Iterable[Any] = value.items() if isinstance(value, Mapping) else value
    frozen: list[tuple[str, tuple[str, ...]]] = []
    for item in items:
        try:
            fused, parts = item
        except (TypeError, ValueError):
            raise ModelInfoError(
                f"packed_modules_mapping entry {item!r}: expected a fused module name and a list of names"
            ) from None
        if not isinstance(fused, str) or isinstance(parts, str | bytes) or not isinstance(parts, Iterable):
            raise ModelInfoError(
                f"packed_modules_mapping entry {fused!r}: expected a module name mapped to a list of "
                f"module names, found {parts!r}"
            )
        names = tuple(parts)
        if not all(isinstance(name, str) for name in names):
            raise ModelInfoError(
                f"packed_modules_mapping[{fused!r}]: expected module names (str), found {list(names)!r}"
            )
        frozen.append((fused, names))
    return tuple(sorted(frozen))


@attrs.frozen
class ModelInfo:
    """Capabilities of one architecture's model class, as the registry reports them.

    ``packed_modules_mapping`` says which checkpoint modules each fused layer
    holds; it is stored as sorted ``(fused, (part, ...))`` pairs so the record
    stays hashable; :meth:`packed_modules` gives it back as a dict.
    """

    architecture: str
    is_text_generation_model: bool = False
    supports_tensor_parallel: bool = False
    supports_pipeline_parallel: bool = False
    supports_quantization: bool = False
    tied_embeddings_supported: bool = False
    packed_modules_mapping: PackedModules = attrs.field(default=(), converter=_packed_modules)
    fallback_for: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    """For a fallback class: the architectures it can build (its ``fallback_architectures``), sorted."""

    def packed_modules(self) -> dict[str, list[str]]:
        """``packed_modules_mapping`` in the shape model classes declare it."""
        return {fused: list(parts) for fused, parts in self.packed_modules_mapping}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_json` reads it back."""
        data = attrs.asdict(self, recurse=False)
        data["packed_modules_mapping"] = self.packed_modules()
        data["fallback_for"] = list(self.fallback_for)
        return data

    @classmethod
    def from_json(cls, data: Any) -> ModelInfo:
        """Rebuild from :meth:`to_json` output; raises :class:`ModelInfoError` on any other shape."""
        if not isinstance(data, Mapping):
            raise ModelInfoError(f"expected a JSON object, found {type(data).__name__}")
        fields = attrs.fields_dict(cls)
        if set(data) != set(fields):
            raise ModelInfoError(f"expected the keys {sorted(fields)}, found {sorted(data)}")
        if not isinstance(data["architecture"], str):
            raise ModelInfoError(f"architecture: expected a string, found {data['architecture']!r}")
        for name in fields:
            if name not in ("architecture", "packed_modules_mapping", "fallback_for") and not isinstance(
                    data[name], bool):
                raise ModelInfoError(f"{name}: expected true or false, found {data[name]!r}")
        if not isinstance(data["packed_modules_mapping"], Mapping):
            raise ModelInfoError("packed_modules_mapping: expected a JSON object")
        covered = data["fallback_for"]
        if not isinstance(covered, list) or not all(isinstance(name, str) for name in covered):
            raise ModelInfoError(f"fallback_for: expected a list of architecture names, found {covered!r}")
        return cls(**data)


def _flag(cls: type, name: str) -> bool:
    value = getattr(cls, name, False)
    if not isinstance(value, bool):
        raise ModelInfoError(f"{cls.__qualname__}.{name}: expected True or False, found {value!r}")
    return value


def inspect_model_class(architecture: str, cls: type) -> ModelInfo:
    """Read a model class's capabilities from its attributes; never instantiates it.

    The mixins of :mod:`loader._interfaces` set the ``supports_*`` flags; a class
    may also set them (or override a mixin's) directly. A missing flag is
    ``False``. Raises :class:`ModelInfoError` for a flag that is not a bool or a
    malformed ``packed_modules_mapping``.
    """
    if not isinstance(cls, type):
        raise ModelInfoError(f"expected a class, found {type(cls).__name__} {cls!r}")
    packed = getattr(cls, "packed_modules_mapping", None) or {}
    if not isinstance(packed, Mapping):
        raise ModelInfoError(
            f"{cls.__qualname__}.packed_modules_mapping: expected a dict of module name -> list of names, "
            f"found {type(packed).__name__}"
        )
    covered = getattr(cls, "fallback_architectures", ())
    if isinstance(covered, str) or not isinstance(covered, Iterable) or not all(
            isinstance(name, str) for name in covered):
        raise ModelInfoError(
            f"{cls.__qualname__}.fallback_architectures: expected architecture names, found {covered!r}"
        )
    return ModelInfo(
        architecture=architecture,
        is_text_generation_model=_flag(cls, "is_text_generation_model"),
        supports_tensor_parallel=_flag(cls, "supports_tensor_parallel"),
        supports_pipeline_parallel=_flag(cls, "supports_pipeline_parallel"),
        supports_quantization=_flag(cls, "supports_quantization"),
        tied_embeddings_supported=_flag(cls, "tied_embeddings_supported"),
        packed_modules_mapping=packed,
        fallback_for=tuple(sorted(covered)),
    )
