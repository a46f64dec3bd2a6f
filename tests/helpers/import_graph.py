"""The import graph of first-party packages, read from their sources, and its cycles.

Every ``import`` and ``from ... import`` counts wherever it stands — at module
level or inside a function — because an import moved into a function to dodge
a cycle hides the cycle without removing it. Imports under ``if TYPE_CHECKING:``
do not count: they never run. ``from pkg import name`` points at the submodule
``pkg.name`` when there is one, else at ``pkg`` itself (a name its
``__init__`` defines). Importing a submodule runs its parents' ``__init__``
first; that implicit edge is not drawn, since a package's ``__init__`` that
imports its own submodules would otherwise always close a loop.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import attrs

__all__ = ["ImportEdge", "ImportGraph", "build_import_graph", "package_roots", "strongly_connected"]


@attrs.frozen
class ImportEdge:
    """One import statement: who imports whom, on which line, and whether inside a function."""

    importer: str
    imported: str
    line: int
    in_function: bool


@attrs.frozen
class ImportGraph:
    """Modules (dotted name -> source file) and the import edges between them."""

    modules: Mapping[str, Path]
    edges: tuple[ImportEdge, ...]

    def cycles(self) -> list[list[str]]:
        """Each set of modules that import each other, directly or through others (sorted names)."""
        targets: dict[str, set[str]] = {name: set() for name in self.modules}
        for edge in self.edges:
            targets[edge.importer].add(edge.imported)
        return sorted(sorted(c) for c in strongly_connected(targets) if len(c) > 1)

    def function_level(self) -> list[ImportEdge]:
        """The first-party imports made inside functions."""
        return [edge for edge in self.edges if edge.in_function]


def package_roots(repo: Path) -> dict[str, Path]:
    """The core and every in-tree plugin: top-level package name -> its folder."""
    roots = {"loader": repo / "core" / "loader"}
    for folder in sorted(repo.glob("plugins/*/src/loader_plugin_*")):
        roots[folder.name] = folder
    return roots


def build_import_graph(roots: Mapping[str, Path]) -> ImportGraph:
    """Read every module under ``roots`` (top-level package name -> folder) and draw its first-party imports."""
    modules: dict[str, Path] = {}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    edges = [edge for name, path in modules.items() for edge in _module_edges(name, path, modules)]
    return ImportGraph(modules, tuple(edges))


def _module_edges(name: str, path: Path, modules: Mapping[str, Path]) -> Iterator[ImportEdge]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node, in_function in _imports(tree.body, in_function=False):
        for target in _targets(node, package, modules):
            if target != name:
                yield ImportEdge(name, target, node.lineno, in_function)


def _imports(body: Iterable[ast.stmt], *, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in ``body`` and the blocks nested in it, skipping ``if TYPE_CHECKING:`` blocks."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, in_function
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _imports(node.orelse, in_function=in_function)
        else:
            nested = in_function or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                for child in getattr(node, field, ()):
                    if isinstance(child, ast.stmt):
                        yield from _imports([child], in_function=nested)
                    elif isinstance(child, ast.excepthandler | ast.match_case):
                        yield from _imports(child.body, in_function=nested)


def _targets(node: ast.Import | ast.ImportFrom, package: str, modules: Mapping[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            found = _known_prefix(alias.name, modules)
            if found is not None:
                yield found
        return
    if node.level:
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    found = _known_prefix(source, modules)
    if found is None:
        return
    for alias in node.names:
        submodule = f"{source}.{alias.name}"
        yield submodule if found == source and submodule in modules else found


def _known_prefix(dotted: str, modules: Mapping[str, Path]) -> str | None:
    """The longest leading part of ``dotted`` that is a first-party module; ``None`` for a third-party one."""
    while dotted and dotted not in modules:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def strongly_connected(targets: Mapping[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of ``targets`` (node -> the nodes it points at), iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in targets:
        if start in index:
            continue
        work = [(start, iter(sorted(targets[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(targets.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                found.append(component)
    return found
