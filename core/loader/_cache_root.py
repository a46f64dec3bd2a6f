"""The folder every on-disk cache of loader lives under: ``$LOADER_CACHE_DIR``, else the user cache folder.

One place for the rule, so the probe cache (``model-info/``) and the compiled packing helpers (``native/``)
always share a base; ``platformdirs`` is imported only when the variable is unset (its import is not free).
"""

from __future__ import annotations

from pathlib import Path

from ._settings import CACHE_DIR

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$LOADER_CACHE_DIR``, else ``platformdirs.user_cache_dir("loader")``."""
    base = CACHE_DIR.read()
    if base is None:
        import platformdirs

        return Path(platformdirs.user_cache_dir("loader"))
    return base
