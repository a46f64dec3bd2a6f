"""The folder every on-disk cache of loader lives under: ``$LOADER_CACHE_DIR``, else the user cache folder.

One place for the rule, so the probe cache (``model-info/``) and the compiled packing helpers (``native/``)
always share a base; ``platformdirs`` is imported only when the variable is unset (its import is not free).
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """``$LOADER_CACHE_DIR``, else ``platformdirs.user_cache_dir("loader")``."""
    base = os.environ.get("LOADER_CACHE_DIR")
    if not base:
        import platformdirs

        base = platformdirs.user_cache_dir("loader")
    return Path(base)
