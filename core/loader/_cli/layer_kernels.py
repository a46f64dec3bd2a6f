"""The per-layer kernel records of a quantization, summarised the same way for ``loader load`` and ``inspect``.

A quantization's ``describe()`` may hold ``layers``: ``{prefix: {"kernel":
..., "reason": ..., ...}}`` (what each layer runs with and, when it is not
the preferred kernel, why: each a :meth:`loader.kernels.KernelChoice.record`),
and :meth:`~loader.layers.QuantizeMethodBase.layer_plan` gives the same
records before loading. Any plugin's records print here; keys beyond
``kernel`` and ``reason`` (``types``, ``packed_bytes``, the path per token bucket ``by_tokens`` and where it
came from, ``paths_from``) become columns.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .output import print_table

__all__ = ["UNDECIDED", "kernel_summary_lines", "print_layer_table"]

UNDECIDED = "decided at load"
"""Shown for a layer whose method cannot tell its kernel before its weights are read."""

LayerRecords = Mapping[str, Mapping[str, Any] | None]


def _kernel(record: Mapping[str, Any] | None) -> str:
    return UNDECIDED if record is None else str(record.get("kernel", "?"))


def kernel_summary_lines(layers: LayerRecords) -> list[str]:
    """``"int4pack 154, dequantize 2"``, then one line per distinct fallback reason with its layer count."""
    counts = Counter(_kernel(record) for record in layers.values())
    lines = [", ".join(f"{kernel} {n}" for kernel, n in counts.most_common())]
    reasons = Counter((_kernel(r), str(r["reason"])) for r in layers.values() if r is not None and r.get("reason"))
    for (kernel, reason), n in sorted(reasons.items()):
        lines.append(f"{kernel} ({n} layer{'s' if n != 1 else ''}): {reason}")
    return lines


def _cell(value: Any) -> Any:
    """A list (GGUF's per-part block ``types``) as ``Q4_1, Q8_0``; the paths per token bucket (``by_tokens``)
    as ``float32: packed-bf16`` when every bucket runs one, else ``float32: 1=packed-bf16 ... 257+=dequantize``;
    anything else as it is."""
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, Mapping):
        parts = []
        for dtype, buckets in value.items():
            paths = set(buckets.values()) if isinstance(buckets, Mapping) else {buckets}
            shown = next(iter(paths)) if len(paths) == 1 else " ".join(f"{b}={p}" for b, p in buckets.items())
            parts.append(f"{dtype}: {shown}")
        return "; ".join(parts)
    return value


def print_layer_table(layers: LayerRecords) -> None:
    """One row per layer: prefix, kernel, reason and any further keys the records have."""
    extra: list[str] = []
    for record in layers.values():
        extra += [key for key in (record or {}) if key not in ("kernel", "reason") and key not in extra]
    rows = [[prefix, _kernel(record), (record or {}).get("reason") or "",
             *[_cell((record or {}).get(key, "")) for key in extra]] for prefix, record in layers.items()]
    print_table(["layer", "kernel", "reason", *extra], rows)
