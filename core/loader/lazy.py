"""Public: lazy re-exports for a package's ``__init__`` (PEP 562), declared as one table.

A package that re-exports names from heavy submodules (torch, a vendor
library) and must stay cheap to import — ``loader`` itself, ``loader.layers``,
a plugin whose entry-point module lives inside it — gives this helper its
name → module table and binds what it returns::

    __getattr__, __dir__ = lazy_exports(__name__, globals(), {
        "GPTQConfig": ".config",
        "load_model": "loader._pipeline.load",
    })

Nothing is imported until a name is first read; the value is then stored in
the package's namespace, so later reads are plain attribute lookups. Declare
the same names under ``if TYPE_CHECKING:`` imports and in ``__all__`` so type
checkers and ``from package import *`` see them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, namespace: MutableMapping[str, Any], exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``, serving ``exports`` on first use.

    :param package: the package's ``__name__`` (relative module names resolve against it).
    :param namespace: the package's ``globals()``: each value is stored there once imported.
    :param exports: each lazily exported name → the module defining it under that name,
        relative (``".config"``) or absolute (``"loader._pipeline.load"``).
    """
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *table})

    return __getattr__, __dir__
