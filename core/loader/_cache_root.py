"""The folder every on-disk cache of loader lives under: ``$LOADER_CACHE_DIR``, else the user cache folder.

One place for the rule, so the probe cache (``model-info/``) and the compiled packing helpers (``native/``)
always share a base; ``platformdirs`` is imported only when the variable is unset (its import is not free).

A cache never fails a load: one that cannot be written notes it in what it reports and calls
:func:`warn_cache_not_written`, which says so once per process — the CLI shows it as one ``warning:`` line
on stderr however many caches then fail the same way.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from ._settings import CACHE_DIR

__all__ = ["cache_root", "warn_cache_not_written"]

log = logging.getLogger(__name__)
_warned = False
_warned_lock = threading.Lock()


def cache_root() -> Path:
    """``$LOADER_CACHE_DIR``, else ``platformdirs.user_cache_dir("loader")``."""
    base = CACHE_DIR.read()
    if base is None:
        import platformdirs

        return Path(platformdirs.user_cache_dir("loader"))
    return base


def warn_cache_not_written(folder: Path, error: OSError) -> None:
    """Warn, the first time in this process, that ``folder`` (a cache's) cannot be written and why; later
    calls log at debug level only (each cache's report keeps its own note)."""
    global _warned
    with _warned_lock:
        first, _warned = not _warned, True
    reason = error.strerror or str(error)
    message = (f"cannot write the cache folder {folder} ({reason}): going on without caching there, so later "
               f"runs repeat this work (LOADER_CACHE_DIR names another folder)")
    log.log(logging.WARNING if first else logging.DEBUG, message)
