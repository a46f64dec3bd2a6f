"""The int8 layout of one compressed-tensors group: weight scales' strategy, symmetry, activation quantization.

A leaf record shared by the config (:mod:`.int8_config`), the quantize method and the kernels.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Int8Activations", "Int8Scheme"]


@attrs.frozen
class Int8Activations:
    """How the checkpoint's producer quantizes a layer's input to int8 at inference.

    :ivar dynamic: a scale per token computed from each input (``False``: the stored per-tensor ``input_scale``).
    :ivar symmetric: zero point 0 (``False``: dynamic zero points per token, or the stored ``input_zero_point``).
    """

    dynamic: bool
    symmetric: bool = True


@attrs.frozen
class Int8Scheme:
    """One group's int8 layout.

    :ivar strategy: ``channel`` (a scale per output row), ``tensor`` (one per checkpoint tensor) or ``group``.
    :ivar group_size: input columns per scale for ``group`` (-1 otherwise).
    :ivar activations: ``None`` for weight-only (W8A16) groups.
    """

    strategy: str
    group_size: int = -1
    symmetric: bool = True
    activations: Int8Activations | None = None

    def describe(self) -> dict[str, Any]:
        acts = self.activations
        return {"weights": self.strategy, "group_size": self.group_size, "symmetric": self.symmetric,
                "activations": None if acts is None else {"dynamic": acts.dynamic, "symmetric": acts.symmetric}}
