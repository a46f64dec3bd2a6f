"""This plugin's format names, in a module of their own so the entry point can check them without
importing the readers (:mod:`.detection` pulls in the object store and the snapshot code)."""

from __future__ import annotations

__all__ = ["FORMATS", "RUNAI", "RUNAI_SHARDED"]

RUNAI = "runai_streamer"
RUNAI_SHARDED = "runai_streamer_sharded"
FORMATS = (RUNAI, RUNAI_SHARDED)
