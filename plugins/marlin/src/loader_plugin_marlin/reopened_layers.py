"""What the methods that repack into kernel buffers share when a live update reopens a layer.

The packed-integer and FP8 methods give an updated layer its checkpoint parameters back, record which parts of
which tensors the update writes, rebuild the kernel only from a whole tensor set, and drop the parameters the
update did not consume (:meth:`~loader.layers.QuantizeMethodBase.open_for_update` and its siblings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import nn

from loader.errors import UnsupportedError

__all__ = ["check_whole_set", "drop_reopened"]


def _parts_text(parts: set[object]) -> str:
    return "whole" if None in parts else "parts " + ", ".join(str(part) for part in sorted(parts, key=str))


def check_whole_set(prefix: str, method: str, kind: str, names: Sequence[str], written: Mapping[str, set[object]],
                    parts: int) -> None:
    """Refuse by name an update that gave layer ``prefix`` some of its tensors ``names`` (or some parts of a fused
    layer of ``parts`` parts) but not all: ``kind`` (``"a packed layer"``) is rebuilt from the whole set."""
    whole = {name for name, seen in written.items() if None in seen or len(seen) >= parts}
    missing = [name for name in names if name not in whole]
    if missing:
        given = ", ".join(f"{name} ({_parts_text(set(written[name]))})" for name in names if name in written)
        raise UnsupportedError(
            f"layer {prefix!r} ({method}) was given {given or 'none'} but not all of {', '.join(missing)}: "
            f"{kind} is rebuilt from its whole tensor set ({', '.join(names)}, every part of a fused layer); give "
            "all of them or none")


def drop_reopened(layer: nn.Module, names: Sequence[str]) -> None:
    """Remove the reopened checkpoint parameters ``names`` the layer still holds."""
    held = dict(layer.named_parameters(recurse=False))
    for name in names:
        if name in held:
            delattr(layer, name)
