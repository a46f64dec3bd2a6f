"""How many memory maps mapping checkpoint files may add to the process, under ``vm.max_map_count``.

The kernel caps the memory maps (VMAs) a process may hold (``vm.max_map_count``,
65530 by default); past it every ``mmap`` fails, the loader's and everyone
else's in the process. Mapping a checkpoint splits memory into maps twice
over: each tensor given a region of its own (:func:`region_budget`, half of
what is left when a model is materialized, :data:`MAPS_PER_REGION` each), and
each part mapped inside a region, of which a mixture of experts has tens of
thousands (one per expert and projection). Parts beyond their region's own
allowance draw on :data:`part_maps`, one budget for the whole process: a
quarter of the maps left under the limit when it is first asked. A part it
cannot pay for is copied instead, which is correct and only slower. Maps are
counted as the most a part can add, never assuming the kernel merges
neighbouring maps of one file; they return to the budget when the region's
memory is unmapped.
"""

from __future__ import annotations

import threading

__all__ = ["MAPS_PER_REGION", "MapBudget", "MapsSpent", "maps_left", "part_maps", "region_budget"]

MAPS_PER_REGION = 8
"""Memory maps a region can end up split into before its parts draw on :data:`part_maps`: the region itself
(slack, the span advised for huge pages, the tail) and a first mapped part with the small pages beside it."""

PART_SHARE = 4
""":data:`part_maps` holds ``1 / PART_SHARE`` of the maps left when first asked; regions take at most half of
what is left when a model is materialized, so the two together stay under the limit."""


def maps_left() -> int | None:
    """Memory maps this process may still create (``vm.max_map_count`` minus ``/proc/self/maps``), or
    ``None`` where the system does not say."""
    try:
        with open("/proc/sys/vm/max_map_count", encoding="ascii") as fh:
            limit = int(fh.read().strip())
        with open("/proc/self/maps", "rb") as fh:
            used = sum(1 for _ in fh)
    except (OSError, ValueError):
        return None
    return max(0, limit - used)


def region_budget() -> int:
    """How many tensors may get a region of their own without running into ``vm.max_map_count``.

    Every mapped part and every page advised apart splits the region's memory
    map; a checkpoint with tens of thousands of large tensors (a mixture of
    experts) would otherwise exhaust the kernel's per-process limit, and every
    ``mmap`` after that fails. Half of what is left is used.
    """
    left = maps_left()
    return 1 << 30 if left is None else left // 2 // MAPS_PER_REGION


class MapBudget:
    """Maps that parts mapped inside regions may still add, shared by every load of the process.

    Thread-safe: loads running in several threads take from the same budget.
    ``capacity`` ``None`` is decided on first use, from :func:`maps_left`.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self._lock = threading.Lock()
        self._left = capacity

    def take(self, maps: int) -> bool:
        """Spend ``maps``; ``False`` (nothing spent) when fewer are left."""
        with self._lock:
            if self._left is None:
                left = maps_left()
                self._left = 1 << 30 if left is None else left // PART_SHARE
            if maps > self._left:
                return False
            self._left -= maps
            return True

    def give_back(self, maps: int) -> None:
        """Return ``maps`` spent before (their region was unmapped, or the mapping was refused)."""
        with self._lock:
            if self._left is not None:
                self._left += maps

    @property
    def left(self) -> int | None:
        """Maps still to spend (``None`` until first asked)."""
        return self._left


part_maps = MapBudget()
"""The process's budget for maps of parts beyond their region's allowance."""


class MapsSpent:
    """What one region's parts took from a budget, returned when its memory is unmapped (a finalizer).

    It holds no reference to the region's memory, so it cannot keep that memory alive.
    """

    __slots__ = ("budget", "maps")

    def __init__(self) -> None:
        self.budget: MapBudget | None = None
        self.maps = 0

    def spend(self, budget: MapBudget, maps: int) -> bool:
        """Take ``maps`` from ``budget`` on this region's account; ``False`` when the budget is short."""
        if self.budget is not None and self.budget is not budget:
            return False  # one region, one budget: what it gives back must return where it came from
        if not budget.take(maps):
            return False
        self.budget = budget
        self.maps += maps
        return True

    def give_back(self) -> None:
        """Return everything this region spent."""
        if self.budget is not None and self.maps:
            self.budget.give_back(self.maps)
        self.maps = 0
