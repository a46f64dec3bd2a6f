"""``loader.__version__``: the installed loader-core's version (``None`` when run from an uninstalled tree).

A module of its own so ``loader`` reads the distribution's metadata only when
the version is asked for (a lazy export of the package).
"""

from __future__ import annotations

from ._plugins import _core_version

__all__ = ["__version__"]

__version__: str | None = _core_version()
