"""The declared plugin API, in one place, and the check that a plugin keeps to it.

A plugin may import the modules in :data:`PUBLIC_MODULES` and, from each, the
names in its ``__all__``; every other ``loader`` module (all of them
underscore-prefixed, plus the submodules of :mod:`loader.layers`) is internal
and may change without notice. :func:`private_imports` finds the imports of a
Python source that reach past that surface; the tests run it over every
in-tree plugin, the fixture plugin and the docs' examples.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator

import attrs

__all__ = ["PUBLIC_MODULES", "PrivateImport", "private_imports", "public_names"]

PUBLIC_MODULES = (
    "loader",
    "loader.checkpoint",
    "loader.errors",
    "loader.hookspecs",
    "loader.io",
    "loader.layers",
    "loader.lazy",
    "loader.models",
    "loader.testing",
    "loader.weights",
)
"""The modules a plugin may import; each one's ``__all__`` lists its public names."""


def public_names(module: str) -> frozenset[str]:
    """The names ``module`` (one of :data:`PUBLIC_MODULES`) offers plugins: its ``__all__``."""
    return frozenset(importlib.import_module(module).__all__)


@attrs.frozen
class PrivateImport:
    """One use of an internal name: where, and what."""

    file: str
    line: int
    name: str
    """The dotted internal name (``loader._pipeline.prepare``, ``loader.weights._helper``)."""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: imports {self.name}, which is not in loader's public API"


def _is_loader(module: str) -> bool:
    return module == "loader" or module.startswith("loader.")


def _check_module_name(dotted: str) -> str | None:
    """``None`` when ``dotted`` (``loader.x.y``) is a public module or a public name of one; else the offender."""
    if dotted in PUBLIC_MODULES:
        return None
    module, _, name = dotted.rpartition(".")
    if module in PUBLIC_MODULES and name in public_names(module):
        return None
    return dotted


def _uses(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every ``loader`` name the source imports or reaches through an attribute of an imported module."""
    bound: dict[str, str] = {}  # local name -> the loader module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_loader(alias.name):
                    yield node.lineno, alias.name
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["loader"] = "loader"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _is_loader(node.module):
            if node.module not in PUBLIC_MODULES:
                yield node.lineno, node.module
                continue
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                yield node.lineno, dotted
                if dotted in PUBLIC_MODULES:
                    bound[alias.asname or alias.name] = dotted
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain: list[str] = []
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                chain.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id in bound:
                # the outermost public module the chain names, then one name inside it
                dotted = bound[inner.id]
                for attr in reversed(chain):
                    dotted = f"{dotted}.{attr}"
                    if dotted not in PUBLIC_MODULES:
                        break
                yield node.lineno, dotted


def private_imports(source: str, file: str) -> list[PrivateImport]:
    """The uses of internal ``loader`` names in Python ``source`` (named ``file`` in the results), in line order."""
    found = set()
    for line, dotted in _uses(ast.parse(source, filename=file)):
        offender = _check_module_name(dotted)
        if offender is not None:
            found.add(PrivateImport(file, line, offender))
    return sorted(found, key=lambda p: (p.line, p.name))
