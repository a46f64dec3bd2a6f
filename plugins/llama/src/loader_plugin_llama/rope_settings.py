"""Rotary embedding settings read from a config, old and new spellings alike.

``transformers`` 4.x writes ``rope_theta`` plus an optional ``rope_scaling``
object (its kind under ``rope_type`` or, older, ``type``); ``transformers`` 5
writes one ``rope_parameters`` object holding ``rope_theta`` and the scaling
keys. Checkpoints of both generations are in the wild, so both are read into
one :class:`RopeSettings` that the core's ``get_rope`` understands.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from loader.errors import ConfigError, UnsupportedError
from loader.layers import ROPE_SCALING_FIELDS

from .config_fields import ConfigFields

__all__ = ["RopeSettings", "read_rope_settings"]

_INTEGER_KEYS = ("original_max_position_embeddings",)


@attrs.frozen
class RopeSettings:
    """``theta`` (the base) and the scaling passed to ``get_rope`` (``None`` for plain rotary)."""

    theta: float
    scaling: Mapping[str, Any] | None = None

    @property
    def rope_type(self) -> str:
        return "default" if self.scaling is None else str(self.scaling["rope_type"])


def _positive_finite(value: Any) -> bool:
    """A JSON number above zero; ``json`` reads ``Infinity`` and ``NaN``, which no rotary setting can be."""
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value) and value > 0


def _scaling_kind(fields: ConfigFields, field: str, params: Mapping[str, Any]) -> str:
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise fields.error(f"{field}.rope_type", "a string", kind)
    if kind not in ROPE_SCALING_FIELDS:
        raise UnsupportedError(
            f"{fields.what}: config field '{field}.rope_type' is {kind!r}; supported rotary scalings are "
            + ", ".join(repr(k) for k in ROPE_SCALING_FIELDS)
        )
    return kind


def _scaling_params(fields: ConfigFields, field: str, kind: str, params: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": kind}
    for key in ROPE_SCALING_FIELDS[kind]:
        if params.get(key) is None:
            raise ConfigError(f"{fields.what}: config field '{field}.{key}' is required for "
                              f"rope_type {kind!r} but missing")
    for key, value in params.items():
        if key in ("rope_type", "type", "rope_theta"):
            continue
        if key in _INTEGER_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise fields.error(f"{field}.{key}", "a positive integer", value)
        elif key in ("factor", "low_freq_factor", "high_freq_factor") and not _positive_finite(value):
            raise fields.error(f"{field}.{key}", "a positive number", value)
        elif key == "partial_rotary_factor" and not (_positive_finite(value) and value <= 1):
            raise fields.error(f"{field}.{key}", "a number in (0, 1]", value)
        elif isinstance(value, float) and not math.isfinite(value):
            raise fields.error(f"{field}.{key}", "a finite number", value)
        out[key] = value
    if kind == "llama3" and not out["high_freq_factor"] > out["low_freq_factor"]:
        raise fields.error(f"{field}.high_freq_factor",
                           f"larger than low_freq_factor={out['low_freq_factor']}", out["high_freq_factor"])
    return out


def read_rope_settings(fields: ConfigFields) -> RopeSettings:
    """Read ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (4.x).

    A config holding both (a transformers-5 config edited by hand or by a tool) is read the way
    transformers 5.24's ``convert_rope_params_to_dict`` reads it, so the logits stay transformers':
    a non-empty ``rope_scaling`` replaces ``rope_parameters`` whole (``rope_scaling or
    rope_parameters``), and ``rope_theta`` comes from the chosen object, else the top-level
    ``rope_theta``, else 10000 -- a ``rope_parameters.rope_theta`` beside a ``rope_scaling``
    is dropped, as transformers drops it.
    """
    scaling = fields.mapping("rope_scaling")
    new_style = fields.mapping("rope_parameters")
    if scaling or new_style is None:
        field, params = "rope_scaling", scaling or {}
    else:
        field, params = "rope_parameters", new_style
    if "rope_theta" in params:
        theta_value = params["rope_theta"]
        if not _positive_finite(theta_value):
            raise fields.error(f"{field}.rope_theta", "a positive number", theta_value)
        theta = float(theta_value)
    else:
        theta = fields.number("rope_theta", 10000.0)
    kind = _scaling_kind(fields, field, params)
    if kind == "default":
        return RopeSettings(theta=theta)
    return RopeSettings(theta=theta, scaling=_scaling_params(fields, field, kind, params))
