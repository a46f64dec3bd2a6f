"""The declared plugin API, in one place, and the check that a plugin keeps to it.

A plugin may import the modules in :data:`PUBLIC_MODULES` and, from each, the
names in its ``__all__``; every other ``loader`` module (all of them
underscore-prefixed, plus the submodules of :mod:`loader.layers` and :mod:`loader.kernels`) is internal
and may change without notice. :func:`private_imports` finds the imports of a
Python source that reach past that surface; the tests run it over every
in-tree plugin, the fixture plugin and the docs' examples.

Plugins build on each other too (Mistral and Qwen on Llama). A plugin
``loader_plugin_<name>`` offers the others the names in its package's
``__all__`` (:func:`plugin_public_names`), imported from the package itself;
its submodules are its own. :func:`private_imports` reports another plugin's
submodule or undeclared name the same way as an internal of the core.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
from collections.abc import Iterator
from pathlib import PurePath

import attrs

__all__ = ["PLUGIN_PREFIX", "PUBLIC_MODULES", "PrivateImport", "plugin_public_names", "private_imports", "public_names"]

PUBLIC_MODULES = (
    "loader",
    "loader.checkpoint",
    "loader.errors",
    "loader.hookspecs",
    "loader.io",
    "loader.kernels",
    "loader.layers",
    "loader.lazy",
    "loader.models",
    "loader.settings",
    "loader.testing",
    "loader.weights",
)
"""The modules a plugin may import; each one's ``__all__`` lists its public names."""

PLUGIN_PREFIX = "loader_plugin_"
"""How a plugin's import package is named (``loader_plugin_llama``)."""


def public_names(module: str) -> frozenset[str]:
    """The names ``module`` (one of :data:`PUBLIC_MODULES`) offers plugins: its ``__all__``."""
    return frozenset(importlib.import_module(module).__all__)


@functools.cache
def plugin_public_names(package: str) -> frozenset[str]:
    """The names plugin ``package`` offers other plugins: the literal ``__all__`` of its ``__init__.py``.

    Read from the source without importing the package; empty when the
    package is not installed or its ``__all__`` is not a literal list.
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return frozenset()
    with open(spec.origin, encoding="utf-8") as source:
        tree = ast.parse(source.read(), filename=spec.origin)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            try:
                return frozenset(str(name) for name in ast.literal_eval(node.value))
            except ValueError:
                return frozenset()
    return frozenset()


def _package_of(file: str) -> str | None:
    """The plugin package ``file`` belongs to (its innermost ``loader_plugin_*`` folder), if any."""
    return next((part for part in reversed(PurePath(file).parts[:-1]) if part.startswith(PLUGIN_PREFIX)), None)


@attrs.frozen
class PrivateImport:
    """One use of an internal name: where, and what."""

    file: str
    line: int
    name: str
    """The dotted internal name (``loader._pipeline.prepare``, ``loader.weights._helper``)."""

    def __str__(self) -> str:
        owner = self.name.partition(".")[0]
        return f"{self.file}:{self.line}: imports {self.name}, which is not in {owner}'s public API"


def _is_checked(module: str, own: str | None) -> bool:
    """Whether an import of ``module`` must keep to a declared surface: the core's, or another plugin's."""
    top = module.partition(".")[0]
    return top == "loader" or (top.startswith(PLUGIN_PREFIX) and top != own)


def _is_public_module(module: str) -> bool:
    return module in PUBLIC_MODULES or (module.startswith(PLUGIN_PREFIX) and "." not in module)


def _check_module_name(dotted: str) -> str | None:
    """``None`` when ``dotted`` (``loader.x.y``, ``loader_plugin_x.y``) is a public module or a public name of
    one; else the offender."""
    if _is_public_module(dotted):
        return None
    module, _, name = dotted.rpartition(".")
    if module in PUBLIC_MODULES and name in public_names(module):
        return None
    if _is_public_module(module) and name in plugin_public_names(module):
        return None
    return dotted


def _uses(tree: ast.AST, own: str | None) -> Iterator[tuple[int, str]]:
    """Every checked name (the core's, another plugin's) the source imports or reaches through an attribute of
    an imported module; ``own`` is the plugin package the source belongs to."""
    bound: dict[str, str] = {}  # local name -> the checked module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_checked(alias.name, own):
                    yield node.lineno, alias.name
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        top = alias.name.partition(".")[0]
                        bound[top] = top
        elif (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
              and _is_checked(node.module, own)):
            if not _is_public_module(node.module):
                yield node.lineno, node.module
                continue
            for alias in node.names:
                dotted = f"{node.module}.{alias.name}"
                yield node.lineno, dotted
                if _is_public_module(dotted):
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
                    if not _is_public_module(dotted):
                        break
                yield node.lineno, dotted


def private_imports(source: str, file: str, package: str | None = None) -> list[PrivateImport]:
    """The uses of internal names in Python ``source`` (named ``file`` in the results), in line order.

    Internal: a ``loader`` name outside :data:`PUBLIC_MODULES`, or a name of
    another plugin outside its :func:`plugin_public_names`. ``package``, the
    plugin the source belongs to (its own modules are free to it), defaults
    to the innermost ``loader_plugin_*`` folder of ``file``.
    """
    own = package if package is not None else _package_of(file)
    found = set()
    for line, dotted in _uses(ast.parse(source, filename=file), own):
        offender = _check_module_name(dotted)
        if offender is not None:
            found.add(PrivateImport(file, line, offender))
    return sorted(found, key=lambda p: (p.line, p.name))
